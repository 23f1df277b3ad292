"""Step time of sparse training: dense versus Static, GMP and RigL on one MLP.

    python benchmarks/bench_sparsity.py                 # MLP 1024-2048-2048-10, batch 256
    python benchmarks/bench_sparsity.py --width 256     # quick smoke run

Each algorithm trains in a fresh subprocess (cstorch has one backend per process) with a
traced step: forward, backward, SGD with momentum. Reported per algorithm: the first call
(capture + compile + one step), the median time of the later steps (each one waits for its
loss), and the number of traces (1: mask updates stay inside the compiled program).
Dynamic algorithms update their masks every ``--freq`` steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGORITHMS = ["dense", "static", "gmp", "rigl"]


def _run_one(algorithm: str, width: int, batch: int, steps: int, freq: int) -> dict:
    import torch

    import cerebras.pytorch as cstorch

    backend = cstorch.backend("CPU")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 2 * width),
        torch.nn.ReLU(),
        torch.nn.Linear(2 * width, 2 * width),
        torch.nn.ReLU(),
        torch.nn.Linear(2 * width, 10),
    )
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sparsity = {
        "dense": None,
        "static": lambda: cstorch.sparse.Static(sparsity=0.9),
        "gmp": lambda: cstorch.sparse.GMP(
            sparsity={"type": "linear", "init": 0.5, "slope": 0.4 / steps}, update={"freq": freq}
        ),
        "rigl": lambda: cstorch.sparse.RigL(sparsity=0.9, update={"freq": freq}),
    }[algorithm]
    if sparsity is not None:
        sparsity = sparsity()
        model.apply(sparsity)
        optimizer.apply(sparsity)

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    x = torch.randn(batch, width)
    y = torch.randint(0, 10, (batch,))
    start = time.perf_counter()
    float(step(x, y))
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        float(step(x, y))
        times.append(time.perf_counter() - start)
    return {
        "algorithm": algorithm,
        "first_s": first,
        "step_ms": statistics.median(times) * 1e3,
        "traces": step.trace_count,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--freq", type=int, default=10)
    parser.add_argument("--one", choices=ALGORITHMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(
            "RESULT "
            + json.dumps(_run_one(args.one, args.width, args.batch, args.steps, args.freq))
        )
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "compat")]))
    print(
        f"MLP {args.width}-{2 * args.width}-{2 * args.width}-10, batch {args.batch}, "
        f"{args.steps} steps, mask updates every {args.freq} steps (CPU backend)"
    )
    print(f"{'algorithm':<10}{'first call s':>14}{'step ms':>10}{'traces':>8}")
    for algorithm in ALGORITHMS:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                algorithm,
                "--width",
                str(args.width),
                "--batch",
                str(args.batch),
                "--steps",
                str(args.steps),
                "--freq",
                str(args.freq),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
        line = next((s for s in out.stdout.splitlines() if s.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"{algorithm} failed:\n{out.stderr[-3000:]}")
        r = json.loads(line[len("RESULT ") :])
        print(f"{algorithm:<10}{r['first_s']:>14.2f}{r['step_ms']:>10.2f}{r['traces']:>8}")


if __name__ == "__main__":
    main()
