"""Training-step speed and memory: eager torch, torch.compile and cstorch-on-JAX, each in its own process.

Why separate processes: once JAX has started, its thread pool competes with torch's for the
cores, and eager torch in the same process runs 2-3x slower, so a same-process comparison would
flatter this project. Every measurement here is a fresh interpreter (`--child`), and the engines
are run alternately (A/B/A/B, `--rounds` times) so slow drifts of the machine hit all of them alike.

Workloads:
* mlp:         784-1024-1024-10, batch 256, SGD with momentum
* transformer: d256, 4 heads, seq 128, batch 16, 2 blocks, AdamW
* gpt2-small:  d768, 12 heads, seq 256, batch 4, 12 blocks, vocab 50257, AdamW

For each run: first-step time (until the first loss is ready) and, for cstorch, its split into
capture (torch -> ATen graph), lowering (graph -> jaxpr, which is when the interpreter runs),
MLIR emission and XLA compile; the median steady-state step time; peak RSS. cstorch steps are timed
in windows with one synchronisation at the end (dispatch is asynchronous); eager torch is
synchronous. The table gives, per runner, the median over rounds with the min-max range and the
ratio of medians to eager torch. `--depth-sweep` measures cstorch's first step at 2/4/8/12
blocks of the transformer and fits the per-block cost. `--json PATH` writes everything.

    python benchmarks/bench_engine.py [--only mlp,transformer,gpt2-small] [--rounds 3]
        [--steps 20] [--precision fp32,bf16] [--no-compile] [--depth-sweep] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

WORKLOADS = {
    "mlp": dict(kind="mlp", sizes=(784, 1024, 1024, 10), batch=256, optimizer="sgd"),
    "transformer": dict(kind="gpt", vocab=1024, d=256, heads=4, layers=2, seq=128, batch=16,
                        optimizer="adamw"),
    "gpt2-small": dict(kind="gpt", vocab=50257, d=768, heads=12, layers=12, seq=256, batch=4,
                       optimizer="adamw"),
}
DEPTHS = (2, 4, 8, 12)


def _workload(name, layers=None):
    """(model, batch, loss_fn, optimizer kind) of a named workload, seeded."""
    import torch

    from tests.models import MLP, TinyGPT, lm_loss

    spec = dict(WORKLOADS[name])
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if spec["kind"] == "mlp":
        model = MLP(spec["sizes"])
        x = torch.randn(spec["batch"], spec["sizes"][0], generator=g)
        y = torch.randint(0, spec["sizes"][-1], (spec["batch"],), generator=g)
        return model, (x, y), torch.nn.functional.cross_entropy, spec["optimizer"]
    model = TinyGPT(vocab=spec["vocab"], d=spec["d"], heads=spec["heads"],
                    layers=layers or spec["layers"], seq=spec["seq"])
    tokens = torch.randint(0, spec["vocab"], (spec["batch"], spec["seq"] + 1), generator=g)
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    return model, batch, lm_loss, spec["optimizer"]


def _optimizer(module, kind, model):
    if kind == "sgd":
        return module.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return module.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)


def run_eager(name, steps, compiled=False, layers=None):
    import torch

    model, (x, y), loss_fn, kind = _workload(name, layers)
    optimizer = _optimizer(torch.optim, kind, model)

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
    result = {"first": time.perf_counter() - t0}
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(x, y).item()
        times.append(time.perf_counter() - t0)
    result["median"] = statistics.median(times) if times else None
    return result


class _FirstStepSplit:
    """Times the phases of the first step: capture (wrapped here) and JAX's own compile events."""

    EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "lowering",
              "/jax/core/compile/jaxpr_to_mlir_module_duration": "mlir",
              "/jax/core/compile/backend_compile_duration": "xla_compile"}

    def __init__(self):
        import jax.monitoring

        import cstorch.core.compile as compile_module

        self.seconds = {"capture": 0.0, "lowering": 0.0, "mlir": 0.0, "xla_compile": 0.0}
        jax.monitoring.register_event_duration_secs_listener(self._on_event)
        capture = compile_module.capture_step

        def timed_capture(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return capture(*args, **kwargs)
            finally:
                self.seconds["capture"] += time.perf_counter() - t0

        compile_module.capture_step = timed_capture

    def _on_event(self, event, duration, **_):
        phase = self.EVENTS.get(event)
        if phase:
            self.seconds[phase] += duration


def run_cstorch(name, steps, precision="fp32", window=5, layers=None):
    import cerebras.pytorch as cstorch

    split = _FirstStepSplit()
    if precision == "bf16":
        cstorch.amp.set_half_dtype("bfloat16")
    model, (x, y), loss_fn, kind = _workload(name, layers)
    backend = cstorch.backend("CPU", artifact_dir="/tmp/cstorch_bench")
    compiled = cstorch.compile(model, backend)
    optimizer = _optimizer(cstorch.optim, kind, model)

    @cstorch.trace
    def step(x, y):
        loss = loss_fn(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    t0 = time.perf_counter()
    step(x, y).item()
    result = {"first": time.perf_counter() - t0, "first_split": dict(split.seconds)}
    times = []
    for _ in range(steps // window):
        t0 = time.perf_counter()
        for _ in range(window):
            loss = step(x, y)
        loss.jax_array.block_until_ready()
        times.append((time.perf_counter() - t0) / window)
    assert step.trace_count == 1
    result["median"] = statistics.median(times) if times else None
    return result


def _child(spec):
    engine, name, steps, precision, layers = spec.split(":")
    steps, layers = int(steps), int(layers) or None
    if engine == "eager":
        result = run_eager(name, steps, layers=layers)
    elif engine == "compile":
        result = run_eager(name, steps, compiled=True, layers=layers)
    else:
        result = run_cstorch(name, steps, precision, layers=layers)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def _measure(engine, name, steps, precision="fp32", layers=0, timeout=1800):
    """One measurement in a fresh interpreter; None (with its stderr shown) when it fails."""
    cmd = [sys.executable, __file__, "--child", f"{engine}:{name}:{steps}:{precision}:{layers}"]
    # The first step's capture is measured, not read from the graph cache (unless asked to).
    env = dict(os.environ)
    env.setdefault("CSTORCH_GRAPH_CACHE", "off")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        sys.stderr.write(f"{engine} {name}: timed out after {timeout} s\n")
        return None
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    sys.stderr.write(out.stderr[-3000:])
    return None


def _summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _runners(args):
    runners = [("eager torch", "eager", "fp32")]
    if not args.no_compile:
        runners.append(("torch.compile", "compile", "fp32"))
    runners += [(f"cstorch-jax {p}", "cstorch", p) for p in args.precision.split(",")]
    return runners


def bench_workloads(args):
    """Alternates the runners round by round; returns {workload: {runner: [results]}}."""
    results = {}
    for name in args.only.split(","):
        per_runner = {label: [] for label, _, _ in _runners(args)}
        for r in range(args.rounds):
            for label, engine, precision in _runners(args):
                print(f"  round {r + 1}/{args.rounds}: {name} {label}", file=sys.stderr, flush=True)
                per_runner[label].append(_measure(engine, name, args.steps, precision))
        results[name] = per_runner
    return results


def print_table(results):
    header = (f"{'workload':12s} {'runner':19s} {'median step ms (min-max)':>26s} {'vs eager':>8s} "
              f"{'first step s':>12s} {'capture':>7s} {'lower':>6s} {'mlir':>5s} {'xla':>5s} "
              f"{'peak RSS MiB':>12s} {'vs eager':>8s}")
    print(header)
    print("-" * len(header))
    for name, per_runner in results.items():
        eager = per_runner.get("eager torch", [])
        eager_step = _summary([r and r["median"] for r in eager])
        eager_rss = _summary([r and r["peak_rss_mib"] for r in eager])
        for label, runs in per_runner.items():
            step = _summary([r and r["median"] for r in runs])
            if step is None:
                print(f"{name:12s} {label:19s} {'failed':>26s}")
                continue
            first = _summary([r["first"] for r in runs if r])
            rss = _summary([r["peak_rss_mib"] for r in runs if r])
            splits = [r["first_split"] for r in runs if r and "first_split" in r]
            phases = "".join(
                f" {statistics.median(s[p] for s in splits):{w}.2f}" if splits else " " * (w + 1)
                for p, w in (("capture", 7), ("lowering", 6), ("mlir", 5), ("xla_compile", 5)))
            step_ms = (f"{step['median'] * 1e3:.1f} ({step['min'] * 1e3:.1f}-"
                       f"{step['max'] * 1e3:.1f})")
            ratio = step["median"] / eager_step["median"] if eager_step else float("nan")
            rss_ratio = rss["median"] / eager_rss["median"] if eager_rss else float("nan")
            print(f"{name:12s} {label:19s} {step_ms:>26s} {ratio:8.2f} {first['median']:12.2f}"
                  f"{phases} {rss['median']:12.0f} {rss_ratio:8.2f}")


def depth_sweep(args):
    """cstorch fp32 first-step time per transformer depth, with a least-squares per-block cost."""
    rows = []
    for layers in DEPTHS:
        runs = [_measure("cstorch", "transformer", 0, "fp32", layers) for _ in range(args.rounds)]
        rows.append({"layers": layers, "first": _summary([r and r["first"] for r in runs]),
                     "capture": _summary([r and r["first_split"]["capture"] for r in runs])})
    xs = [r["layers"] for r in rows if r["first"]]
    ys = [r["first"]["median"] for r in rows if r["first"]]
    fit = None
    if len(xs) >= 2:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        fit = {"seconds_per_block": slope, "intercept": my - slope * mx}
    print(f"\n{'blocks':>6s} {'first step s (min-max)':>24s} {'capture s':>9s}")
    for r in rows:
        if r["first"]:
            f = r["first"]
            print(f"{r['layers']:6d} {f['median']:10.2f} ({f['min']:.2f}-{f['max']:.2f})"
                  f"{r['capture']['median']:10.2f}")
    if fit:
        print(f"per-block first-step cost: {fit['seconds_per_block']:.3f} s "
              f"(intercept {fit['intercept']:.2f} s)")
    return {"rows": rows, "fit": fit}


def _environment():
    import importlib.metadata as md

    versions = {}
    for package in ("torch", "jax", "jaxlib"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = None
    return {"python": platform.python_version(), "cpus": os.cpu_count(), **versions,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="mlp,transformer,gpt2-small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--precision", default="fp32", help="cstorch precisions, e.g. fp32,bf16")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--depth-sweep", action="store_true")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.child)
    report = {"environment": _environment(), "args": vars(args)}
    if args.only:
        report["workloads"] = bench_workloads(args)
        print_table(report["workloads"])
    if args.depth_sweep:
        report["depth_sweep"] = depth_sweep(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
