"""Resident memory of a training run: eager torch vs cstorch-on-JAX, each in its own process.

For each workload of ``bench_engine`` (mlp, transformer, gpt2-small) and each engine, a fresh
interpreter reports RSS in MiB: after the imports, after building the model and optimizer,
and the peak over three phases: the first step (capture, compile, first run), ``--steps``
steady steps, and a synchronisation (``state_dict()`` of model and optimizer, as a checkpoint
takes) followed by ``--steps`` more steps. Peaks are the kernel's high-water mark (VmHWM),
reset between phases through ``/proc/self/clear_refs``, so this runs on Linux only. RSS
counts mapped library pages too, which the page cache may evict under memory pressure;
``anon`` (RssAnon at the end) is the part that scales with the model. ``own/eager`` compares
each engine's own part, its peak less its RSS after the imports (JAX's runtime is not the
workload's). Every run is a cold start, as in ``bench_engine``: the graph and XLA caches are
off, so the first step's peak includes XLA's compile.

    python benchmarks/bench_memory.py [--only mlp,transformer,gpt2-small] [--steps 5]
        [--rounds 1] [--json out.json]
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

PHASES = ("imports", "built", "first_step", "steady", "after_sync", "peak", "anon")


def _status(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _child(engine: str, name: str, steps: int) -> dict:
    import torch

    from benchmarks.bench_engine import _optimizer, _workload, training_step

    if engine == "cstorch":
        import cerebras.pytorch as cstorch
    result = {"imports": _status("VmRSS")}
    model, (x, y), loss_fn, kind = _workload(name)
    if engine == "eager":
        forward, optimizer = model, _optimizer(torch.optim, kind, model)
    else:
        backend = cstorch.backend("CPU", artifact_dir=tempfile.mkdtemp())
        forward = cstorch.compile(model, backend)
        optimizer = _optimizer(cstorch.optim, kind, model)

    step = training_step(forward, loss_fn, optimizer)
    if engine == "cstorch":
        step = cstorch.trace(step)
    result["built"] = _status("VmRSS")
    peak = result["built"]

    def phase(label, run):
        nonlocal peak
        _reset_peak()
        run()
        result[label] = _status("VmHWM")
        peak = max(peak, result[label])

    phase("first_step", lambda: float(step(x, y)))
    phase("steady", lambda: [float(step(x, y)) for _ in range(steps)])

    def sync_then_steps():
        model.state_dict(), optimizer.state_dict()  # read (as a checkpoint is), then dropped
        for _ in range(steps):
            float(step(x, y))

    phase("after_sync", sync_then_steps)
    result["peak"] = peak
    result["anon"] = _status("RssAnon")
    return result


def _measure(engine: str, name: str, steps: int) -> dict | None:
    from benchmarks.bench_engine import COLD

    cmd = [sys.executable, __file__, "--child", f"{engine}:{name}:{steps}"]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=3600, env={**os.environ, **COLD}
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    sys.stderr.write(out.stderr[-3000:])
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="mlp,transformer,gpt2-small")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        engine, name, steps = args.child.split(":")
        print("RESULT " + json.dumps(_child(engine, name, int(steps))))
        return
    results = {}
    header = f"{'workload':12s} {'engine':8s}" + "".join(f"{p:>11s}" for p in PHASES)
    print(header + f"{'peak/eager':>11s}{'own/eager':>10s}")
    for name in args.only.split(","):
        results[name] = {}
        for engine in ("eager", "cstorch"):
            runs = [
                r for r in (_measure(engine, name, args.steps) for _ in range(args.rounds)) if r
            ]
            if not runs:
                print(f"{name:12s} {engine:8s} failed")
                continue
            row = {p: statistics.median(r[p] for r in runs) for p in PHASES}
            results[name][engine] = row
            eager = results[name].get("eager")
            ratio = row["peak"] / eager["peak"] if eager else float("nan")
            own = (
                (row["peak"] - row["imports"]) / (eager["peak"] - eager["imports"])
                if eager
                else float("nan")
            )
            print(
                f"{name:12s} {engine:8s}"
                + "".join(f"{row[p]:11.0f}" for p in PHASES)
                + f"{ratio:11.2f}{own:10.2f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
