"""Where the tests find the reference implementation's outputs.

``tests/data/reference-2.10/`` holds copies of the fixtures produced by cerebras-pytorch
2.10.0 (see its README.md) and ``tests/data/api_names.json`` the public-name inventory of
that release, so the oracle tests run identically on any checkout.
"""

import pathlib

DATA = pathlib.Path(__file__).resolve().parent / "data"
REFERENCE = DATA / "reference-2.10"
API_NAMES = DATA / "api_names.json"
