"""Training-step speed: eager torch vs torch.compile vs cstorch-on-JAX, measured in one run.

Workloads (the engine issue's targets):
* mlp:         784-1024-1024-10, batch 256, SGD with momentum
* transformer: d=256, 4 heads, seq 128, batch 16, 4 layers, AdamW

For each: first-step time (trace + compile + run, until the loss is ready) and the median of
steady-state step times. cstorch steps are timed in windows of several steps with one
synchronisation at the end (dispatch is asynchronous, so a single step's wall time is not
meaningful); eager torch is synchronous. Peak RSS is reported per process.

    python benchmarks/bench_engine.py [--steps 30] [--only mlp,transformer] [--no-compile]
                                      [--precision fp32,bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _workload(name):
    import torch

    from tests.models import MLP, TinyGPT, lm_loss

    g = torch.Generator().manual_seed(0)
    if name == "mlp":
        model = MLP((784, 1024, 1024, 10))
        x = torch.randn(256, 784, generator=g)
        y = torch.randint(0, 10, (256,), generator=g)
        loss_fn = torch.nn.functional.cross_entropy
        return model, (x, y), loss_fn, "sgd"
    model = TinyGPT(vocab=1024, d=256, heads=4, layers=4, seq=128)
    tokens = torch.randint(0, 1024, (16, 129), generator=g)
    return model, (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()), lm_loss, "adamw"


def _torch_optimizer(kind, model):
    import torch

    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)


def run_eager(name, steps, compiled=False):
    import torch

    model, (x, y), loss_fn, kind = _workload(name)
    optimizer = _torch_optimizer(kind, model)

    def step(x, y):
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    if compiled:
        step = torch.compile(step)
    t0 = time.perf_counter()
    step(x, y).item()
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(x, y).item()
        times.append(time.perf_counter() - t0)
    return {"first": first, "median": statistics.median(times)}


def run_cstorch(name, steps, precision="fp32", window=5):
    import torch

    import cerebras.pytorch as cstorch

    if precision == "bf16":
        cstorch.amp.set_half_dtype("bfloat16")
    model, (x, y), loss_fn, kind = _workload(name)
    backend = cstorch.backend("CPU", artifact_dir="/tmp/cstorch_bench")
    compiled = cstorch.compile(model, backend)
    if kind == "sgd":
        optimizer = cstorch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    @cstorch.trace
    def step(x, y):
        loss = loss_fn(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    t0 = time.perf_counter()
    step(x, y).item()
    first = time.perf_counter() - t0
    times = []
    for _ in range(max(steps // window, 1)):
        t0 = time.perf_counter()
        for _ in range(window):
            loss = step(x, y)
        loss.jax_array.block_until_ready()
        times.append((time.perf_counter() - t0) / window)
    assert step.trace_count == 1
    del torch
    return {"first": first, "median": statistics.median(times)}


def _child(args):
    kind, name, steps, precision = args.child.split(":")
    steps = int(steps)
    if kind == "eager":
        result = run_eager(name, steps)
    elif kind == "compile":
        result = run_eager(name, steps, compiled=True)
    else:
        result = run_cstorch(name, steps, precision)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def _measure(kind, name, steps, precision="fp32"):
    """Runs one measurement in a fresh process (clean caches, honest first-step time)."""
    out = subprocess.run([sys.executable, __file__, "--child", f"{kind}:{name}:{steps}:{precision}"],
                         capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    sys.stderr.write(out.stderr[-3000:])
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--only", default="mlp,transformer")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--precision", default="fp32", help="cstorch precisions, e.g. fp32,bf16")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)
    rows = []
    for name in args.only.split(","):
        eager = _measure("eager", name, args.steps)
        rows.append((name, "eager torch", eager, eager))
        if not args.no_compile:
            rows.append((name, "torch.compile", _measure("compile", name, args.steps), eager))
        for precision in args.precision.split(","):
            rows.append((name, f"cstorch-jax {precision}",
                         _measure("cstorch", name, args.steps, precision), eager))
    header = f"{'workload':12s} {'runner':20s} {'first step s':>12s} {'median step ms':>15s} " \
             f"{'vs eager':>9s} {'peak RSS MiB':>13s}"
    print(header)
    print("-" * len(header))
    for name, runner, result, eager in rows:
        if result is None:
            print(f"{name:12s} {runner:20s} {'failed':>12s}")
            continue
        ratio = result["median"] / eager["median"] if eager else float("nan")
        print(f"{name:12s} {runner:20s} {result['first']:12.2f} {result['median'] * 1e3:15.2f} "
              f"{ratio:9.2f} {result['peak_rss_mib']:13.0f}")


if __name__ == "__main__":
    main()
