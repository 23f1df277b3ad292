"""Where the tests find the reference implementation's outputs.

``tests/data/reference-2.10/`` holds copies of the fixtures produced by cerebras-pytorch
2.10.0 (see its README.md) and ``tests/data/api_names.json`` the public-name inventory of
that release, so the oracle tests run identically on any checkout.
"""

import json
import pathlib

import torch

DATA = pathlib.Path(__file__).resolve().parent / "data"
REFERENCE = DATA / "reference-2.10"
API_NAMES = DATA / "api_names.json"

OPTIMIZER_TRAJECTORIES = json.loads((REFERENCE / "optimizer_trajectories.json").read_text())[
    "trajectories"
]


def optimizer_problem():
    """The trajectories' problem: w, b, x, t drawn in that order from one seeded generator
    (loss = mean((x @ w + b - t)**2), see the fixture's "problem" field)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 3, generator=g)
    b = torch.randn(3, generator=g)
    x = torch.randn(8, 4, generator=g)
    t = torch.randn(8, 3, generator=g)
    return w, b, x, t
