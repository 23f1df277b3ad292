"""Run by test_multidevice.py in a subprocess with XLA_FLAGS forcing several CPU devices.

Trains a RigL-sparse MLP on CSX with different cluster configs (data-parallel replicas,
weight servers) and prints, as JSON, each run's losses, final mask and trace count."""

import json

import torch

import cerebras.pytorch as cstorch
from cstorch.distributed import ClusterConfig


def run(num_csx, max_wgt_servers):
    cstorch.backend._reset_for_tests()
    backend = cstorch.backend(
        "CSX", cluster_config=ClusterConfig(num_csx=num_csx, max_wgt_servers=max_wgt_servers)
    )
    cstorch.amp.enable_mixed_precision(False)  # compare placement, not precision
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rigl = cstorch.sparse.RigL(sparsity=0.5, init_method="topk", update={"freq": 2})
    model.apply(rigl)
    optimizer.apply(rigl)

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 12, generator=g)
    y = torch.randint(0, 4, (8,), generator=g)
    losses = [float(step(x, y)) for _ in range(5)]
    mask = model.state_dict()["0.weight_mask"]
    return {
        "losses": losses,
        "mask": mask.int().flatten().tolist(),
        "trace_count": step.trace_count,
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps({f"{n}:{w}": run(n, w) for n, w in [(1, 0), (2, 2)]}))
