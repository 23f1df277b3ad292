"""Run by test_distributed_launcher.py as each worker of a launched CSX job: joins the job
(jax.distributed on 127.0.0.1, one CPU device per process), then trains a small MLP for
many steps, writing ``<pid> <step>`` to ``<progress dir>/<process id>`` after every step.

Mode (second argument): ``train`` trains until stopped; ``block``: after step 5, process 0
(the coordinator's host) sleeps in user code, with a SIGTERM handler that does not end it,
while process 1 goes on into the next step's collective and waits there.
"""

import os
import signal
import sys
import time

import torch

import cerebras.pytorch as cstorch
from cstorch.distributed import ClusterConfig
from tests.models import MLP


def report(directory, rank, step):
    path = os.path.join(directory, str(rank))
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {step}")
    os.replace(path + ".tmp", path)


def main(directory, mode):
    backend = cstorch.backend(
        "CSX", artifact_dir=directory + "-artifacts", cluster_config=ClusterConfig(num_csx=2)
    )
    cstorch.amp.enable_mixed_precision(False)
    torch.manual_seed(0)
    model = MLP((16, 32, 4))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.01)
    rank = cstorch.distributed.get_streaming_rank()

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    x, y = torch.randn(4, 16), torch.randint(0, 4, (4,))
    for i in range(1, 100_000):
        if mode == "block" and i == 6 and rank == 0:
            signal.signal(signal.SIGTERM, lambda signum, frame: None)
            time.sleep(600)  # user code; the other process waits for it in a collective
        float(step(x, y))
        report(directory, rank, i)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
