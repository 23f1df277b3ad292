"""Run by test_multidevice.py in a subprocess with XLA_FLAGS forcing several CPU devices.

Trains the same MLP on CSX with different cluster configs and prints, as JSON, each run's
per-step losses and how its state arrays are placed."""

import json
import sys

import torch

import cerebras.pytorch as cstorch
from cstorch.distributed import ClusterConfig
from tests.models import MLP
from tests.sharding_spec import spec_entries


def run(num_csx, max_wgt_servers):
    cstorch.backend._reset_for_tests()
    backend = cstorch.backend(
        "CSX", cluster_config=ClusterConfig(num_csx=num_csx, max_wgt_servers=max_wgt_servers)
    )
    cstorch.amp.enable_mixed_precision(False)  # compare sharding, not precision
    torch.manual_seed(0)
    model = MLP((16, 32, 4))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []

    @cstorch.step_closure
    def record(loss):
        losses.append(loss.item())

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record(loss)
        return loss

    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(10)
    ]
    for x, y in cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(lambda: batches)):
        step(x, y)
    weight = model.net[1].weight
    array = backend._impl.device_state.array_of(weight)
    return {
        "losses": losses,
        "devices": len(array.sharding.device_set),
        "spec": spec_entries(array.sharding),
        "final": model.state_dict()["net.1.weight"].sum().item(),
    }


if __name__ == "__main__":
    configs = json.loads(sys.argv[1])
    print("RESULT " + json.dumps({f"{n}:{w}": run(n, w) for n, w in configs}))
