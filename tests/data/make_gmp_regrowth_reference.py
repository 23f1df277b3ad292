"""Records ``gmp_cosine_regrowth_reference.json`` with cerebras-pytorch 2.10 (the reference).

Run it with a Python that has the reference installed (never this project):

    /path/to/refenv/bin/python tests/data/make_gmp_regrowth_reference.py tests/data/

The problem is the one of ``reference-2.10/sparsity_trajectories.json`` (MLP 12-16-3 after
``torch.manual_seed(0)``, x = randn(64, 12) from a generator seeded 3, full batch, SGD
lr=0.1 momentum=0.9, cross entropy) with GMP on a cosine schedule whose sparsity rises to 0.6
and falls again, so masks regrow: per step the loss, every mask and every weight.
"""

import json
import os
import sys

import torch

import cerebras.pytorch as cstorch

STEPS = 20
SPARSITY = {"type": "cosine", "init": 0.0, "minimum": 0.6, "half_period": 8}


def _rounded(values):
    """float32 values to 8 significant digits (a float32 needs at most 9; the test's
    tolerance is 1e-5)."""
    if isinstance(values, list):
        return [_rounded(v) for v in values]
    return float(f"{values:.8g}")


def main(out_dir):
    backend = cstorch.backend("CPU")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 12, generator=g)
    y = (x[:, :4].sum(-1) > 0).long() + (x[:, 4] > 0.5).long()
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sparsity = cstorch.sparse.GMP(sparsity=SPARSITY, update={"freq": 2}, init_method="topk")
    model.apply(sparsity)
    optimizer.apply(sparsity)

    @cstorch.trace
    def step(xb, yb):
        loss = torch.nn.functional.cross_entropy(compiled(xb), yb)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    record = {"losses": [], "masks": [], "weights": []}

    @cstorch.step_closure
    def keep(loss):
        record["losses"].append(float(loss))

    loader = cstorch.utils.data.DataLoader(lambda: [(x, y)] * STEPS)
    for xb, yb in cstorch.utils.data.DataExecutor(loader, num_steps=STEPS):
        keep(step(xb, yb))
        state = model.state_dict()
        record["masks"].append(
            {k[: -len("_mask")]: v.int().tolist() for k, v in state.items() if k.endswith("_mask")}
        )
        record["weights"].append(
            {k: _rounded(v.tolist()) for k, v in state.items() if not k.endswith("_mask")}
        )
    result = {
        "made_with": f"cerebras-pytorch {cstorch.__version__}, torch {torch.__version__}, CPU",
        "problem": "MLP 12-16-3 (Linear,ReLU,Linear), torch.manual_seed(0) init, x = "
        "randn(64,12) gen seed 3, y = (x[:,:4].sum(-1)>0) + (x[:,4]>0.5), full "
        "batch, SGD lr=0.1 momentum=0.9, cross_entropy, 20 steps in a DataExecutor",
        "sparsity": {
            "algorithm": "GMP",
            "sparsity": SPARSITY,
            "update": {"freq": 2},
            "init_method": "topk",
        },
        **record,
    }
    with open(os.path.join(out_dir, "gmp_cosine_regrowth_reference.json"), "w") as f:
        json.dump(result, f, separators=(",", ":"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
