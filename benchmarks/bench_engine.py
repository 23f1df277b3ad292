"""Training-step speed and memory: eager torch, torch.compile and cstorch-on-JAX, each in its own process.

Why separate processes: once JAX has started, its thread pool competes with torch's for the
cores, and eager torch in the same process runs 2-3x slower, so a same-process comparison would
flatter this project. Every measurement here is a fresh interpreter (`--child`), and the engines
are run alternately (A/B/A/B, `--rounds` times) so slow drifts of the machine hit all of them alike.

Workloads:
* mlp:         784-1024-1024-10, batch 256, SGD with momentum
* transformer: d256, 4 heads, seq 128, batch 16, 2 blocks, AdamW
* gpt2-small:  d768, 12 heads, seq 256, batch 4, 12 blocks, vocab 50257, AdamW
* gpt:         d384, 6 heads, seq 128, batch 8, 4 blocks, vocab 256, torch.optim.AdamW (the
               torch optimizer in both engines: cstorch adopts it)
* cnn:         pytorch/examples' MNIST network (conv 1->32 3x3, conv 32->64 3x3, max-pool,
               fc 9216->128->10, log-softmax, NLL), batch 64, Adadelta (lr 1.0); its dropout
               layers are left out, so the engines' losses can be compared

Every run is a cold start (graph and XLA caches off); a second table gives cstorch's warm
start (the second run of an unchanged script, XLA's cache warm), with the graph cache off (the
default) and on. `--warm-only` runs just that table.

For each run: first-step time (until the first loss is ready) and, for cstorch, its split into
capture (torch -> ATen graph), lowering (graph -> jaxpr, which is when the interpreter runs),
MLIR emission and XLA compile; the median steady-state step time; peak RSS, and the workload's
own part of it (peak less the RSS after imports). Each workload also gets a floor: its FLOPs
(XLA's count) at this machine's fp32 matmul rate, measured in torch. cstorch steps are timed
in windows with one synchronisation at the end (dispatch is asynchronous); eager torch is
synchronous. The table gives, per runner, the median over rounds with the min-max range and the
ratio of medians to eager torch. `--depth-sweep` measures cstorch's first step at 2/4/8/12
blocks of the transformer and fits the per-block cost. `--executor-runs` times whole training
runs as a script makes them (cstorch through a `DataExecutor`, its end of run included; eager
torch the same loop): 10-step runs and a long run, per step. `--json PATH` writes everything.

    python benchmarks/bench_engine.py [--only mlp,transformer,gpt2-small] [--rounds 3]
        [--steps 20] [--precision fp32,bf16] [--no-compile] [--executor-runs] [--depth-sweep]
        [--interference]
        [--json out.json]
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
    "transformer": dict(
        kind="gpt", vocab=1024, d=256, heads=4, layers=2, seq=128, batch=16, optimizer="adamw"
    ),
    "gpt2-small": dict(
        kind="gpt", vocab=50257, d=768, heads=12, layers=12, seq=256, batch=4, optimizer="adamw"
    ),
    "gpt": dict(
        kind="gpt", vocab=256, d=384, heads=6, layers=4, seq=128, batch=8, optimizer="torch-adamw"
    ),
    "cnn": dict(kind="cnn", batch=64, optimizer="adadelta"),
}
DEPTHS = (2, 4, 8, 12)


def _workload(name, layers=None):
    """(model, batch, loss_fn, optimizer kind) of a named workload, seeded."""
    import torch

    from tests.models import MLP, MnistNet, TinyGPT, lm_loss

    spec = dict(WORKLOADS[name])
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if spec["kind"] == "cnn":
        model = MnistNet()
        x = torch.randn(spec["batch"], 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (spec["batch"],), generator=g)
        return model, (x, y), torch.nn.functional.nll_loss, spec["optimizer"]
    if spec["kind"] == "mlp":
        model = MLP(spec["sizes"])
        x = torch.randn(spec["batch"], spec["sizes"][0], generator=g)
        y = torch.randint(0, spec["sizes"][-1], (spec["batch"],), generator=g)
        return model, (x, y), torch.nn.functional.cross_entropy, spec["optimizer"]
    model = TinyGPT(
        vocab=spec["vocab"],
        d=spec["d"],
        heads=spec["heads"],
        layers=layers or spec["layers"],
        seq=spec["seq"],
    )
    tokens = torch.randint(0, spec["vocab"], (spec["batch"], spec["seq"] + 1), generator=g)
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    return model, batch, lm_loss, spec["optimizer"]


def _optimizer(module, kind, model):
    """The workload's optimizer from ``module`` (torch.optim or cstorch.optim); "torch-adamw"
    is torch's in both engines."""
    if kind == "sgd":
        return module.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if kind == "adadelta":
        return module.Adadelta(model.parameters(), lr=1.0)
    if kind == "torch-adamw":
        import torch

        module = torch.optim
    # eps given: cstorch's AdamW defaults to 1e-6 (the reference's), torch's to 1e-8, and the
    # loss-gap column compares the same maths.
    return module.AdamW(model.parameters(), lr=1e-3, eps=1e-8, weight_decay=0.01)


def training_step(forward, loss_fn, optimizer):
    """The step every engine runs: forward, loss, backward, optimizer update; returns the loss."""

    def step(x, y):
        loss = loss_fn(forward(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return step


def run_eager(name, steps, compiled=False, layers=None, precision="fp32"):
    """Eager torch (or torch.compile); ``precision`` "bf16" runs the step under
    ``torch.autocast("cpu", torch.bfloat16)``, the eager counterpart of cstorch's bf16."""
    import torch

    import_rss = _rss_mib()
    model, (x, y), loss_fn, kind = _workload(name, layers)
    plain = training_step(model, loss_fn, _optimizer(torch.optim, kind, model))
    if precision == "bf16":

        def step(*batch):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return plain(*batch)
    else:
        step = plain
    if compiled:
        step = torch.compile(step)
    t0 = time.perf_counter()
    result = {"losses": [step(x, y).item()]}
    result["first"] = time.perf_counter() - t0
    times, cpu_times = [], []
    usage = _KernelUsage()
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        result["losses"].append(step(x, y).item())
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    result.update(usage.per_step(steps))
    result["median"] = statistics.median(times) if times else None
    result["cpu_median"] = statistics.median(cpu_times) if cpu_times else None
    result["import_rss_mib"] = import_rss
    return result


class _KernelUsage:
    """Page faults and kernel CPU time per step, from the process's rusage: a step whose
    working memory is mapped afresh each run pays both (cpu_results.md)."""

    def __init__(self):
        self.start = resource.getrusage(resource.RUSAGE_SELF)

    def per_step(self, steps):
        if not steps:
            return {}
        end = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "faults_per_step": (end.ru_minflt - self.start.ru_minflt) / steps,
            "sys_ms_per_step": (end.ru_stime - self.start.ru_stime) * 1e3 / steps,
        }


def _timed(seconds, phase, fn):
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[phase] += time.perf_counter() - t0

    return timed


class _FirstStepSplit:
    """Times the phases of the first step: capture and lowering (the graph interpreter's run
    under jit's trace), wrapped here, and JAX's own MLIR and XLA compile events. (JAX's trace
    event is not used for lowering: it also fires for every jitted jnp helper traced inside.)"""

    EVENTS = {
        "/jax/core/compile/jaxpr_to_mlir_module_duration": "mlir",
        "/jax/core/compile/backend_compile_duration": "xla_compile",
    }

    def __init__(self):
        import jax.monitoring

        import cstorch.core.step_capture as step_capture
        from jax_backend.program import Program

        self.seconds = {"capture": 0.0, "lowering": 0.0, "mlir": 0.0, "xla_compile": 0.0}
        jax.monitoring.register_event_duration_secs_listener(self._on_event)
        step_capture.capture_step = _timed(self.seconds, "capture", step_capture.capture_step)
        Program.pure_step = _timed(self.seconds, "lowering", Program.pure_step)

    def _on_event(self, event, duration, **_):
        phase = self.EVENTS.get(event)
        if phase:
            self.seconds[phase] += duration


def _step_flops(step) -> float | None:
    """XLA's count of floating-point operations in one step, lowered with XLA's kernels
    throughout (a convolution run by torch's kernels is a host callback XLA does not count)."""
    import jax
    import numpy as np

    from jax_backend.jax_settings import engine_scope

    program = step.programs[0]
    donated, kept = program.split_state(program.state_specs())
    with engine_scope():
        analysis = (
            jax.jit(program.pure_step)
            .lower(donated, kept, program.input_specs(), np.int64(0))
            .compile()
            .cost_analysis()
        )
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    return analysis.get("flops")


def _cstorch_step(name, layers=None):
    """(the workload's traced cstorch training step, its batch)."""
    import cerebras.pytorch as cstorch

    model, batch, loss_fn, kind = _workload(name, layers)
    compiled = cstorch.compile(model, cstorch.backend("CPU", artifact_dir="/tmp/cstorch_bench"))
    step = training_step(compiled, loss_fn, _optimizer(cstorch.optim, kind, model))
    return cstorch.trace(step), batch


def run_cstorch(name, steps, precision="fp32", window=None, layers=None):
    import jax.numpy as jnp

    import cerebras.pytorch as cstorch

    jnp.zeros(()).block_until_ready()  # the runtime is part of the import baseline
    split = _FirstStepSplit()
    import_rss = _rss_mib()
    if precision == "bf16":
        cstorch.amp.set_half_dtype("bfloat16")
    step, (x, y) = _cstorch_step(name, layers)
    t0 = time.perf_counter()
    losses = [step(x, y).item()]
    result = {"first": time.perf_counter() - t0, "first_split": dict(split.seconds)}
    traces = step.trace_count  # (a torch optimizer is adopted by a second capture)
    times, cpu_times = [], []
    window = window or max(1, min(5, steps // 3))
    usage = _KernelUsage()
    for _ in range(steps // window):
        t0, c0 = time.perf_counter(), time.process_time()
        window_losses = [step(x, y) for _ in range(window)]
        window_losses[-1].jax_array.block_until_ready()
        times.append((time.perf_counter() - t0) / window)
        cpu_times.append((time.process_time() - c0) / window)
        losses += [float(loss.item()) for loss in window_losses]
    result.update(usage.per_step(steps // window * window))
    assert step.trace_count == traces, "the step was captured again while timed"
    result["losses"] = losses
    result["median"] = statistics.median(times) if times else None
    result["cpu_median"] = statistics.median(cpu_times) if cpu_times else None
    result["import_rss_mib"] = import_rss
    result["peak_rss_mib"] = _rss_mib()  # before the cost analysis below compiles again
    result["flops"] = _step_flops(step)
    return result


# Executor runs (``--executor-runs``): the way a cstorch script trains, a ``DataExecutor`` run
# over a data loader, timed whole (the end of the run, which brings the state back, included).
RUN_STEPS = 10  # a short run, as the independent harness timed them
LONG_RUN_STEPS = {"mlp": 100, "transformer": 30}
SHORT_RUNS = 5  # short runs per process, after one run that compiles


def run_executor_runs(engine, name):
    """Per-step time of whole runs, in one process: ``SHORT_RUNS`` runs of ``RUN_STEPS`` steps
    (the median) and one long run, each from its first batch to its last loss read back
    (``.item()``). cstorch runs go through ``DataExecutor`` (so its end of run is inside the
    time); eager torch runs the same loop over the same batches. The first run (compile, warm
    up) is reported apart."""
    if engine == "cstorch":
        import cerebras.pytorch as cstorch

        step, batch = _cstorch_step(name)

        def batches(n):
            return cstorch.utils.data.DataExecutor(
                cstorch.utils.data.DataLoader(lambda: [batch] * n), num_steps=n
            )
    else:
        import torch

        model, batch, loss_fn, kind = _workload(name)
        step = training_step(model, loss_fn, _optimizer(torch.optim, kind, model))

        def batches(n):
            return [batch] * n

    def timed_run(n):
        t0 = time.perf_counter()
        loss = None
        for x, y in batches(n):
            loss = step(x, y)
        loss.item()
        return (time.perf_counter() - t0) / n

    first = timed_run(RUN_STEPS)
    short = [timed_run(RUN_STEPS) for _ in range(SHORT_RUNS)]
    long = timed_run(LONG_RUN_STEPS[name])
    return {
        "first_run_per_step": first,
        "short_run_per_step": statistics.median(short),
        "short_runs": short,
        "long_run_per_step": long,
    }


def executor_runs(args):
    """Eager torch and cstorch in whole runs, alternately, each round in fresh processes;
    prints the table and returns {workload: {engine: [results]}}."""
    results = {}
    for name in [n for n in args.only.split(",") if n in LONG_RUN_STEPS]:
        results[name] = {"eager": [], "cstorch": []}
        for r in range(args.rounds):
            for engine in ("eager", "cstorch"):
                print(
                    f"  round {r + 1}/{args.rounds}: {name} {engine}, executor runs",
                    file=sys.stderr,
                    flush=True,
                )
                results[name][engine].append(_measure(f"runs-{engine}", name, 0))
    print(
        f"\n{'executor runs':14s} {'engine':8s} {f'{RUN_STEPS}-step runs ms/step (min-max)':>33s}"
        f" {'vs eager':>8s} {'long run ms/step':>16s} {'vs eager':>8s} {'first run ms/step':>17s}"
    )
    for name, per_engine in results.items():
        eager_short = _summary([r and r["short_run_per_step"] for r in per_engine["eager"]])
        eager_long = _summary([r and r["long_run_per_step"] for r in per_engine["eager"]])
        for engine, runs in per_engine.items():
            short = _summary([r and r["short_run_per_step"] for r in runs])
            long = _summary([r and r["long_run_per_step"] for r in runs])
            first = _summary([r and r["first_run_per_step"] for r in runs])
            if not (short and long and first):
                print(f"{name:14s} {engine:8s} failed")
                continue
            spread = (
                f"{short['median'] * 1e3:.1f} ({short['min'] * 1e3:.1f}-{short['max'] * 1e3:.1f})"
            )
            short_ratio = short["median"] / eager_short["median"] if eager_short else float("nan")
            long_ratio = long["median"] / eager_long["median"] if eager_long else float("nan")
            print(
                f"{name:14s} {engine:8s} {spread:>33s} {short_ratio:8.2f}"
                f" {long['median'] * 1e3:16.1f} {long_ratio:8.2f} {first['median'] * 1e3:17.1f}"
            )
    return results


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_matmul_peak(size=2048, repeats=20):
    """This machine's fp32 matmul rate in torch (GFLOP/s): the roofline for the step floors."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return {"gflops": 2 * size**3 / min(times) / 1e9}


def run_interference(mode, rounds=30):
    """Eager torch's MLP step in a process where JAX is idle (``jax``) or has just finished a
    cstorch step each time (``cstorch``, as step closures and data loading do), or absent
    (``torch``). The ratios show whether JAX's threads slow torch work in the same process."""
    import torch

    model, (x, y), loss_fn, kind = _workload("mlp")
    step = training_step(model, loss_fn, _optimizer(torch.optim, kind, model))
    eager_step = lambda: step(x, y).item()  # noqa: E731

    between = lambda: None  # noqa: E731
    if mode in ("jax", "cstorch"):
        import jax.numpy as jnp

        (jnp.ones((512, 512)) @ jnp.ones((512, 512))).block_until_ready()
    if mode == "cstorch":
        step, (cx, cy) = _cstorch_step("mlp")
        between = lambda: step(cx, cy).jax_array.block_until_ready()  # noqa: E731
    for _ in range(3):
        between()
        eager_step()
    times, jax_times = [], []
    for _ in range(rounds):
        between()
        t0 = time.perf_counter()
        eager_step()
        times.append(time.perf_counter() - t0)
        if mode == "cstorch":  # and the other way: a cstorch step right after torch work
            t0 = time.perf_counter()
            between()
            jax_times.append(time.perf_counter() - t0)
    result = {"median": statistics.median(times)}
    if mode == "cstorch":
        alone = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            between()
            alone.append(time.perf_counter() - t0)
        result.update(
            jax_after_torch=statistics.median(jax_times), jax_alone=statistics.median(alone)
        )
    return result


def interference(args):
    """Both directions, with the OpenMP wait policy torch ships with and with
    ``OMP_WAIT_POLICY=PASSIVE`` (torch's idle OpenMP threads sleep instead of spinning)."""
    report = {}
    for policy in ("default", "PASSIVE"):
        env = dict(COLD)
        if policy == "PASSIVE":
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        runs = {m: [] for m in ("torch", "jax", "cstorch")}
        for _ in range(args.rounds):
            for m in runs:
                runs[m].append(_measure("interference", m, 0, env=env))
        summary = {m: _summary([r and r["median"] for r in v]) for m, v in runs.items()}
        for key in ("jax_after_torch", "jax_alone"):
            summary[key] = _summary([r and r[key] for r in runs["cstorch"]])
        report[policy] = summary
        print(f"\nOMP_WAIT_POLICY {policy}: eager torch MLP step (ms, median of rounds)")
        for m, label in (
            ("torch", "no JAX in the process"),
            ("jax", "JAX started, idle"),
            ("cstorch", "right after each cstorch step"),
        ):
            if summary[m] and summary["torch"]:
                ratio = summary[m]["median"] / summary["torch"]["median"]
                print(f"  {label:34s} {summary[m]['median'] * 1e3:7.2f}  ({ratio:.2f}x)")
        if summary["jax_alone"] and summary["jax_after_torch"]:
            alone, after = summary["jax_alone"]["median"], summary["jax_after_torch"]["median"]
            print(
                f"  cstorch MLP step alone {alone * 1e3:.2f} ms, right after torch work "
                f"{after * 1e3:.2f} ms ({after / alone:.2f}x)"
            )
    return report


def _child(spec):
    engine, name, steps, precision, layers = spec.split(":")
    steps, layers = int(steps), int(layers) or None
    if engine == "peak":
        print("RESULT " + json.dumps(run_matmul_peak()))
        return
    if engine == "interference":
        print("RESULT " + json.dumps(run_interference(name)))
        return
    if engine.startswith("runs-"):
        print("RESULT " + json.dumps(run_executor_runs(engine[len("runs-") :], name)))
        return
    if engine == "eager":
        result = run_eager(name, steps, layers=layers, precision=precision)
    elif engine == "compile":
        result = run_eager(name, steps, compiled=True, layers=layers)
    else:
        result = run_cstorch(name, steps, precision, layers=layers)
    result.setdefault("peak_rss_mib", _rss_mib())
    print("RESULT " + json.dumps(result))


# A cold start: neither the captured graph nor the XLA program comes from a cache.
COLD = {"CSTORCH_GRAPH_CACHE": "off", "CSTORCH_COMPILATION_CACHE": "off"}


def _measure(engine, name, steps, precision="fp32", layers=0, timeout=1800, env=None):
    """One measurement in a fresh interpreter; None (with its stderr shown) when it fails.
    ``env`` (default: a cold start) is added to the environment."""
    cmd = [sys.executable, __file__, "--child", f"{engine}:{name}:{steps}:{precision}:{layers}"]
    env = {**os.environ, **(COLD if env is None else env)}
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
    if "bf16" in args.precision.split(","):  # the reference of cstorch's bf16 row
        runners.append(("eager torch bf16", "eager", "bf16"))
    if not args.no_compile:
        runners.append(("torch.compile", "compile", "fp32"))
    runners += [(f"cstorch-jax {p}", "cstorch", p) for p in args.precision.split(",")]
    runners += [
        (f"cstorch-jax {choice}", "cstorch", "fp32")
        for choice in args.step_memory.split(",")
        if choice
    ]
    runners += [(f"cstorch-jax {label}", "cstorch", "fp32") for label in _variants(args)]
    return runners


def _variants(args) -> dict:
    """``--variant LABEL:VAR=VALUE[;VAR=VALUE]`` rows: cstorch fp32 with those environment
    variables (e.g. ``xla-conv:CSTORCH_CPU_CONVOLUTIONS=xla``), {label: env}."""
    variants = {}
    for text in args.variant or ():
        label, _, assignments = text.partition(":")
        variants[label] = dict(a.split("=", 1) for a in assignments.split(";") if a)
    return variants


def _runner_env(label, args=None) -> dict:
    """What a runner adds to a cold start's environment: "cstorch-jax lean", "cstorch-jax
    xla", "cstorch-jax reuse" and "cstorch-jax pool" are fp32 with the engine's
    cpu_step_memory setting at that choice (the plain fp32 row has the default, auto:
    cpu_results.md); a ``--variant`` row its variables."""
    choice = label.split()[-1]
    variants = _variants(args) if args is not None else {}
    if label.startswith("cstorch-jax ") and choice in variants:
        return variants[choice]
    if label.startswith("cstorch-jax ") and choice in ("lean", "xla", "reuse", "pool"):
        return {"CSTORCH_CPU_STEP_MEMORY": choice}
    return {}


# Steady-state steps per workload (GPT-2-small steps take seconds on a CPU).
STEPS = {"gpt2-small": 6}


def bench_workloads(args):
    """Alternates the runners round by round; returns {workload: {runner: [results]}}.
    Every run is a cold start (no cache of any kind)."""
    results = {}
    for name in args.only.split(","):
        per_runner = {label: [] for label, _, _ in _runners(args)}
        steps = min(args.steps, STEPS.get(name, args.steps))
        for r in range(args.rounds):
            for label, engine, precision in _runners(args):
                print(f"  round {r + 1}/{args.rounds}: {name} {label}", file=sys.stderr, flush=True)
                env = {**COLD, **_runner_env(label, args)}
                per_runner[label].append(_measure(engine, name, steps, precision, env=env))
        results[name] = per_runner
    return results


def warm_starts(args):
    """cstorch fp32 first step on the second run of an unchanged script, the XLA program from
    JAX's persistent cache (on by default), with the graph cache off (the default) and on
    (``CSTORCH_GRAPH_CACHE``: the capture is skipped too). A fresh directory per workload,
    primed once by a run with both caches on; the two modes alternate round by round."""
    import tempfile

    modes = {"graph cache off": "off", "graph cache on": "graphs"}
    rows = {}
    for name in args.only.split(","):
        with tempfile.TemporaryDirectory() as tmp:

            def env(graphs):
                return {
                    "CSTORCH_GRAPH_CACHE": graphs if graphs == "off" else os.path.join(tmp, graphs),
                    "CSTORCH_COMPILATION_CACHE": os.path.join(tmp, "xla"),
                }

            print(f"  warm start: {name}", file=sys.stderr, flush=True)
            _measure("cstorch", name, 0, env=env("graphs"))  # the first run fills both caches
            runs = {mode: [] for mode in modes}
            for _ in range(args.rounds):
                for mode, graphs in modes.items():
                    runs[mode].append(_measure("cstorch", name, 0, env=env(graphs)))
        for mode, results in runs.items():
            rows[f"{name}, {mode}"] = {
                "first": _summary([r and r["first"] for r in results]),
                "split": [r["first_split"] for r in results if r],
            }
    print(
        f"\n{'warm start':32s} {'first step s (min-max)':>24s} {'capture':>7s} {'lower':>6s} "
        f"{'mlir':>5s} {'xla':>5s}"
    )
    for name, row in rows.items():
        f = row["first"]
        if not f:
            print(f"{name:32s} {'failed':>24s}")
            continue
        phases = "".join(
            f" {statistics.median(s[p] for s in row['split']):{w}.2f}"
            for p, w in (("capture", 7), ("lowering", 6), ("mlir", 5), ("xla_compile", 5))
        )
        print(f"{name:32s} {f['median']:10.2f} ({f['min']:.2f}-{f['max']:.2f}){'':8s}{phases}")
    return rows


def _reference(label, per_runner) -> str:
    """The eager row a runner is compared with: eager torch under autocast bf16 for a bf16
    row (when measured), else eager torch in fp32."""
    if label.endswith("bf16") and "eager torch bf16" in per_runner:
        return "eager torch bf16"
    return "eager torch"


def _loss_gap(runs, reference_runs):
    """The largest relative difference between a runner's losses and its reference's, step
    by step (the first round of each; None where either has none)."""
    ours = next((r["losses"] for r in runs if r and r.get("losses")), None)
    theirs = next((r["losses"] for r in reference_runs if r and r.get("losses")), None)
    if not ours or not theirs:
        return None
    return max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(ours, theirs))


def print_table(results, peak_gflops=None):
    """One row per runner. Step: the median wall time per step; CPU: the process's CPU time
    (user + system, all threads) per step, which a busy machine disturbs less than the wall
    time. Each ratio is to the runner's eager reference (eager torch; for a bf16 row, eager
    torch under autocast bf16), and ``loss gap`` is the largest relative difference between
    its losses and the reference's, step by step. It measures parity where both engines run
    the same maths: the MLP (SGD), the CNN (Adadelta, whose lr 1.0 amplifies rounding after a
    dozen steps) and the gpt (torch's AdamW in both). The transformer and GPT-2 small run
    cstorch's AdamW, the reference's formula (eps added before the bias correction: an
    effective eps 30x torch's at the first step), so their gap is that formula's (~1e-4).
    RSS: the process's peak, and the workload's own part (peak less the RSS after imports:
    JAX's runtime alone adds ~170 MiB that no model-sized change can remove). The floor is the step's FLOPs (XLA's count) at this
    machine's measured fp32 matmul rate (``run_matmul_peak``): no engine steps faster."""
    header = (
        f"{'workload':12s} {'runner':19s} {'median step ms (min-max)':>26s} {'vs eager':>8s} "
        f"{'CPU ms':>8s} {'vs eager':>8s} {'loss gap':>8s} "
        f"{'first step s':>12s} {'capture':>7s} {'lower':>6s} {'mlir':>5s} {'xla':>5s} "
        f"{'peak RSS MiB':>12s} {'vs eager':>8s} {'own RSS MiB':>11s} {'vs eager':>8s} "
        f"{'sys ms/step':>11s} {'faults/step':>11s}"
    )
    print(header)
    print("-" * len(header))
    for name, per_runner in results.items():

        def summary(label, key, per_runner=per_runner):
            runs = per_runner.get(label, [])
            if key == "own":
                return _summary([r and r["peak_rss_mib"] - r["import_rss_mib"] for r in runs])
            return _summary([r and r.get(key) for r in runs])

        for label, runs in per_runner.items():
            reference = _reference(label, per_runner)
            step = summary(label, "median")
            if step is None:
                print(f"{name:12s} {label:19s} {'failed':>26s}")
                continue

            def ratio(key, label=label, reference=reference):
                ours, theirs = summary(label, key), summary(reference, key)
                return ours["median"] / theirs["median"] if ours and theirs else float("nan")

            cpu = summary(label, "cpu_median")
            gap = _loss_gap(runs, per_runner.get(reference, []))
            first = summary(label, "first")
            rss, own = summary(label, "peak_rss_mib"), summary(label, "own")
            splits = [r["first_split"] for r in runs if r and "first_split" in r]
            phases = "".join(
                f" {statistics.median(s[p] for s in splits):{w}.2f}" if splits else " " * (w + 1)
                for p, w in (("capture", 7), ("lowering", 6), ("mlir", 5), ("xla_compile", 5))
            )
            step_ms = (
                f"{step['median'] * 1e3:.1f} ({step['min'] * 1e3:.1f}-{step['max'] * 1e3:.1f})"
            )
            cpu_ms = f"{cpu['median'] * 1e3:8.1f}" if cpu else f"{'-':>8s}"
            gap_text = f"{gap:8.1e}" if gap is not None and label != reference else f"{'-':>8s}"
            kernel = "".join(
                f" {statistics.median(v):11.{d}f}" if v else f" {'-':>11s}"
                for v, d in (
                    ([r["sys_ms_per_step"] for r in runs if r and "sys_ms_per_step" in r], 1),
                    ([r["faults_per_step"] for r in runs if r and "faults_per_step" in r], 0),
                )
            )
            print(
                f"{name:12s} {label:19s} {step_ms:>26s} {ratio('median'):8.2f} {cpu_ms}"
                f" {ratio('cpu_median'):8.2f} {gap_text} {first['median']:12.2f}"
                f"{phases} {rss['median']:12.0f} {ratio('peak_rss_mib'):8.2f}"
                f" {own['median']:11.0f} {ratio('own'):8.2f}{kernel}"
            )
        eager_step = summary("eager torch", "median")
        flops = [
            r["flops"]
            for label, runs in per_runner.items()
            if not label.endswith("bf16")
            for r in runs
            if r and r.get("flops")
        ]
        if flops and peak_gflops and eager_step:
            floor = flops[0] / (peak_gflops * 1e9)
            print(
                f"{name:12s} {'floor (FLOPs/peak)':19s} {floor * 1e3:26.1f} "
                f"{floor / eager_step['median']:8.2f}   {flops[0] / 1e9:.2f} GFLOP per fp32 "
                f"step at {peak_gflops:.0f} GFLOP/s (measured here)"
            )


def depth_sweep(args):
    """cstorch fp32 first-step time per transformer depth, with a least-squares per-block cost."""
    rows = []
    for layers in DEPTHS:
        runs = [_measure("cstorch", "transformer", 0, "fp32", layers) for _ in range(args.rounds)]
        rows.append(
            {
                "layers": layers,
                "first": _summary([r and r["first"] for r in runs]),
                "capture": _summary([r and r["first_split"]["capture"] for r in runs]),
            }
        )
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
            print(
                f"{r['layers']:6d} {f['median']:10.2f} ({f['min']:.2f}-{f['max']:.2f})"
                f"{r['capture']['median']:10.2f}"
            )
    if fit:
        print(
            f"per-block first-step cost: {fit['seconds_per_block']:.3f} s "
            f"(intercept {fit['intercept']:.2f} s)"
        )
    return {"rows": rows, "fit": fit}


def _environment():
    import importlib.metadata as md

    versions = {}
    for package in ("torch", "jax", "jaxlib"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = None
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        **versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="mlp,transformer,gpt2-small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--precision", default="fp32", help="cstorch precisions, e.g. fp32,bf16")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument(
        "--step-memory",
        default="",
        help="also cstorch fp32 with these CSTORCH_CPU_STEP_MEMORY choices, "
        "e.g. lean,xla,reuse (the fp32 row has the default, auto: the pool where it runs)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        help="also cstorch fp32 with environment variables set: "
        "LABEL:VAR=VALUE[;VAR=VALUE] (repeatable), e.g. "
        "xla-conv:CSTORCH_CPU_CONVOLUTIONS=xla",
    )
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-start table")
    parser.add_argument(
        "--executor-runs",
        action="store_true",
        help=f"also time whole {RUN_STEPS}-step and long DataExecutor runs (mlp, transformer)",
    )
    parser.add_argument("--depth-sweep", action="store_true")
    parser.add_argument(
        "--interference",
        action="store_true",
        help="eager torch's speed in a process where JAX runs",
    )
    parser.add_argument(
        "--warm-only",
        action="store_true",
        help="only the warm-start table (graph cache off and on)",
    )
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.child)
    report = {"environment": _environment(), "args": vars(args)}
    if args.warm_only:
        report["warm_starts"] = warm_starts(args)
    elif args.only:
        peak = _measure("peak", "-", 0)
        report["matmul_gflops"] = peak and peak["gflops"]
        report["workloads"] = bench_workloads(args)
        print_table(report["workloads"], report["matmul_gflops"])
        if not args.no_warm:
            report["warm_starts"] = warm_starts(args)
    if args.executor_runs:
        report["executor_runs"] = executor_runs(args)
    if args.depth_sweep:
        report["depth_sweep"] = depth_sweep(args)
    if args.interference:
        report["interference"] = interference(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
