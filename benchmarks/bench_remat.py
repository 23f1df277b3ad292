"""Activation checkpointing: the memory it saves, eager torch vs cstorch-on-JAX (issue 44).

A block-wise model (an input projection, then ``--blocks`` residual blocks Linear ``--width``
-> ``--hidden`` -> GELU -> Linear back, MSE loss, ``torch.optim.SGD``) trains with each block
plain or wrapped in ``torch.utils.checkpoint.checkpoint`` (``use_reentrant=False`` and
``True``), each engine and mode in a fresh interpreter. Each reports, in MiB: RSS after the
imports and after building, the peak over the first step (for cstorch: capture and XLA's
compile too) and over ``--steps`` steady steps (the kernel's high-water mark, VmHWM, reset
through ``/proc/self/clear_refs``: Linux only), and for cstorch XLA's memory analysis of the
compiled step (``temp``: its working memory; ``args``: what it is given). ``own`` is the
steady peak less the RSS after building: what the steps themselves take. The losses of every
step are compared with eager torch's plain run (``loss/eager``: the largest relative
difference). Caches are off (``bench_engine.COLD``), as in ``bench_memory``; with
``--rounds`` each figure is the median of that many fresh processes.

    python benchmarks/bench_remat.py [--blocks 8 --width 512 --hidden 2048 --batch 2048]
        [--steps 3] [--rounds 1] [--modes plain,non_reentrant,reentrant]
        [--step-memory lean,xla] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

MODES = ("plain", "non_reentrant", "reentrant")


def _status(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _model(mode: str, blocks: int, width: int, hidden: int):
    import torch
    import torch.utils.checkpoint

    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(width, width)
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(
                    torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, width)
                )
                for _ in range(blocks)
            )

        def forward(self, x):
            x = self.embed(x)
            for block in self.blocks:
                if mode == "plain":
                    x = x + block(x)
                else:
                    x = x + torch.utils.checkpoint.checkpoint(
                        block, x, use_reentrant=mode == "reentrant"
                    )
            return x

    torch.manual_seed(0)
    return Blocks()


def _child(spec: dict) -> dict:
    import torch

    engine = spec["engine"]
    if engine == "cstorch":
        import jax.numpy as jnp

        import cerebras.pytorch as cstorch

        jnp.zeros(()).block_until_ready()  # the runtime is part of the import baseline
    result = {"imports": _status("VmRSS")}
    model = _model(spec["mode"], spec["blocks"], spec["width"], spec["hidden"])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(spec["batch"], spec["width"], generator=g)
    y = torch.randn(spec["batch"], spec["width"], generator=g)
    forward = model
    if engine == "cstorch":
        backend = cstorch.backend("CPU", artifact_dir=tempfile.mkdtemp())
        forward = cstorch.compile(model, backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x, y):
        loss = torch.nn.functional.mse_loss(forward(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    if engine == "cstorch":
        step = cstorch.trace(step)
    result["built"] = _status("VmRSS")
    losses = []
    _reset_peak()
    losses.append(float(step(x, y)))
    result["first_step"] = _status("VmHWM")
    _reset_peak()
    for _ in range(spec["steps"]):
        losses.append(float(step(x, y)))
    result["steady"] = _status("VmHWM")
    result["own"] = result["steady"] - result["built"]
    result["losses"] = losses
    if engine == "cstorch":
        program = step.programs[-1]
        analysis = (
            program.lower(program.state_specs(), program.input_specs()).compile().memory_analysis()
        )
        result["temp"] = analysis.temp_size_in_bytes / 2**20
        result["args"] = analysis.argument_size_in_bytes / 2**20
    return result


def _measure(spec: dict, step_memory: str | None) -> dict | None:
    from benchmarks.bench_engine import COLD

    env = {**os.environ, **COLD}
    if step_memory:
        env["CSTORCH_CPU_STEP_MEMORY"] = step_memory
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    sys.stderr.write(out.stderr[-3000:])
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--step-memory",
        default="lean",
        help="cstorch's cpu_step_memory choices to run, comma-separated",
    )
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(_child(json.loads(args.child))))
        return
    base = dict(
        blocks=args.blocks, width=args.width, hidden=args.hidden, batch=args.batch, steps=args.steps
    )
    runs = [("eager", None)] + [("cstorch", m) for m in args.step_memory.split(",")]
    columns = ("imports", "built", "first_step", "steady", "own", "temp", "args")
    print(f"{args.blocks} blocks {args.width}->{args.hidden}, batch {args.batch}; MiB")
    print(
        f"{'engine':15s} {'mode':14s}"
        + "".join(f"{c:>11s}" for c in columns)
        + f"{'loss/eager':>12s}"
    )
    results, reference = {}, None
    for engine, step_memory in runs:
        label = engine if step_memory is None else f"{engine}/{step_memory}"
        for mode in args.modes.split(","):
            rows = [
                r
                for r in (
                    _measure(dict(base, engine=engine, mode=mode), step_memory)
                    for _ in range(args.rounds)
                )
                if r
            ]
            row = (
                {
                    key: (
                        statistics.median(r[key] for r in rows) if key in columns else rows[0][key]
                    )
                    for key in rows[0]
                }
                if rows
                else None
            )
            results[f"{label}:{mode}"] = row
            if row is None:
                print(f"{label:15s} {mode:14s} failed", flush=True)
                continue
            if reference is None and engine == "eager" and mode == "plain":
                reference = row["losses"]
            diff = (
                max(abs(a - b) / abs(b) for a, b in zip(row["losses"], reference))
                if reference
                else float("nan")
            )
            print(
                f"{label:15s} {mode:14s}"
                + "".join(f"{row[c]:11.0f}" if c in row else f"{'-':>11s}" for c in columns)
                + f"{diff:12.1e}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
