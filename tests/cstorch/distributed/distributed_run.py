"""Run by test_distributed_*.py as each process of a job (CSTORCH_* variables set) or alone.

Trains an MLP with AdamW on CSX for ``steps`` steps of a fixed global batch sequence; each
process feeds its slice of every batch (by streaming rank). Options (one JSON argument):
``num_csx``, ``weight_servers``, ``steps``, ``save_at`` + ``ckpt`` (checkpoint closure at that
step), ``resume`` + ``start`` (a checkpoint to continue from, after step ``start``), ``die_at`` (process
``die_rank``, default 1, kills itself at that step), ``hlo`` (report the collectives of the compiled step). Process 0 prints ``RESULT <json>``: per-step losses, the
process count, the final weights, and how a weight is laid out.
"""

import json
import os
import signal
import sys

import numpy as np
import torch

import cerebras.pytorch as cstorch
from cstorch.core import step_introspection
from cstorch.distributed import ClusterConfig
from jax_backend import mesh
from tests.models import MLP
from tests.sharding_spec import spec_entries

GLOBAL_BATCH = 8


def global_batches(count):
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(GLOBAL_BATCH, 16, generator=g),
            torch.randint(0, 4, (GLOBAL_BATCH,), generator=g),
        )
        for _ in range(count)
    ]


def main(options):
    steps, save_at = options["steps"], options.get("save_at")
    backend = cstorch.backend(
        "CSX",
        artifact_dir=options.get("artifact_dir", "."),
        cluster_config=ClusterConfig(
            num_csx=options["num_csx"], max_wgt_servers=options.get("weight_servers", 0)
        ),
    )
    cstorch.amp.enable_mixed_precision(False)  # fp32 policy: compare layouts, not precision
    torch.manual_seed(0)
    model = MLP((16, 32, 4))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    first = 0
    if options.get("resume"):
        state = cstorch.load(options["resume"])
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = options["start"]

    share = cstorch.distributed.get_streaming_batch_size(GLOBAL_BATCH)
    rank = cstorch.distributed.get_streaming_rank()
    batches = [
        (x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share])
        for x, y in global_batches(steps)
    ][first:]
    losses = []

    @cstorch.step_closure
    def record(loss):
        losses.append(loss.item())

    @cstorch.checkpoint_closure
    def save(path):
        cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record(loss)
        return loss

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: batches),
        num_steps=len(batches),
        checkpoint_steps=(save_at - first) if save_at else None,
    )
    for i, (x, y) in enumerate(executor, start=first + 1):
        if i == options.get("die_at") and rank == options.get("die_rank", 1):
            os.kill(os.getpid(), signal.SIGKILL)
        step(x, y)
        if i == save_at and options.get("ckpt"):
            save(options["ckpt"])

    array = backend._impl.device_state.array_of(model.net[1].weight)
    communication = {}
    if options.get("hlo"):
        entry = step._latest()
        hlo = entry.program.lower(*step_introspection.example_arguments(entry)).compile().as_text()
        communication = mesh.communication(hlo)
    final = {k: v.tolist() for k, v in model.state_dict().items()}
    if rank == 0:
        print(
            "RESULT "
            + json.dumps(
                {
                    "losses": losses,
                    "processes": cstorch.distributed.num_streamers(),
                    "devices": len(array.sharding.device_set),
                    "spec": spec_entries(array.sharding),
                    "local_shard_rows": int(np.shape(array.addressable_shards[0].data)[0]),
                    "mesh": dict(
                        getattr(array.sharding, "mesh", None) and array.sharding.mesh.shape or {}
                    ),
                    "final": final,
                    "communication": communication,
                    "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
