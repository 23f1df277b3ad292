"""Communication per training step of the modeled wafer, read from the compiled HLO.

Compiles the GPT example's step (AdamW, clipping, warmup + cosine) on CSX for several
``(num_csx, weight servers)`` layouts over 4 modeled CPU devices and prints, per layout, the
collectives XLA inserted (count and bytes of each op's result on one device) next to the
theory:

* data parallel, replicated state: one all-reduce of every gradient (P bytes, where P is
  the parameter bytes); a ring moves 2(N-1)/N·P bytes per device;
* sharded state (weight servers / ZeRO-3) over N devices: all-gather of the parameters where
  they are used (P bytes of results per gather) and a reduce-scatter of the gradients (P/N
  bytes of results); a ring moves (N-1)/N·P per device for each. Tensors whose first
  dimension does not divide stay replicated and are all-reduced instead.

Run: ``XLA_FLAGS=--xla_force_host_platform_device_count=4 python benchmarks/bench_distributed_comm.py``
(a multi-process job compiles the same SPMD program; only the device assignment differs).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from cstorch.core import step_introspection
from cstorch.distributed import ClusterConfig
from jax_backend import mesh

sys.path.insert(0, "examples")
from gpt_adamw import GPT


def measure(num_csx, weight_servers, args):
    cstorch.backend._reset_for_tests()
    backend = cstorch.backend(
        "CSX",
        artifact_dir="/tmp/bench_comm",
        cluster_config=ClusterConfig(num_csx=num_csx, max_wgt_servers=weight_servers),
    )
    cstorch.amp.enable_mixed_precision(False)
    torch.manual_seed(0)
    model = GPT(args.vocab, args.d_model, 4, args.layers, args.seq)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    @cstorch.trace
    def training_step(inputs, targets):
        logits = compiled(inputs)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
        cstorch.amp.optimizer_step(loss, optimizer, cstorch.amp.GradScaler(), max_gradient_norm=1.0)
        return loss

    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
    training_step(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    entry = training_step._latest()
    hlo = entry.program.lower(*step_introspection.example_arguments(entry)).compile().as_text()
    params = {id(p): p for p in model.parameters()}.values()
    layout = backend._impl.layout
    sharded = sum(
        p.numel() * 4
        for p in params
        if layout.state_sharding(tuple(p.shape)).spec != layout.replicated().spec
    )
    return {
        "num_csx": num_csx,
        "weight_servers": weight_servers,
        "mesh": dict(layout.mesh.shape),
        "param_bytes": sum(p.numel() * 4 for p in params),
        "sharded_param_bytes": sharded,
        "collectives": {
            op: {"count": c, "bytes": b} for op, (c, b) in sorted(mesh.communication(hlo).items())
        },
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    for num_csx, weight_servers in ((4, 0), (4, 1), (2, 2)):
        print(json.dumps(measure(num_csx, weight_servers, args)), flush=True)


if __name__ == "__main__":
    main()
