"""A GPT training step on a GPU: eager torch, torch.compile and cstorch's GPU backend, each
engine in its own process, in fp32 and bf16.

Workloads (AdamW, untied head, causal ``scaled_dot_product_attention``):
* gpt2s: 162M parameters, d768, 12 heads, 12 layers, seq 1024, batch 8, vocab 50304
* small: d256, 4 heads, 2 layers, seq 128, batch 16, vocab 512

Per run: steady-state ms per step (windows of steps with one synchronisation at the end; for
cstorch inside one DataExecutor run, so the run's end is not in it), tokens/s, model FLOP/s
and MFU (model FLOPs per step: 6 x the parameters that multiply, i.e. all but the token
embedding, plus attention's 12 x layers x d x seq, per token; peak from ``PEAK_TFLOPS`` for
the detected GPU), the first step (from building the model to its first loss, the device
runtime already started), for cstorch the end of the DataExecutor run (what it copies back
to torch), a full state read-back (``state_dict()`` of model and optimizer) and the first
step's phases, and peak device memory. fp32 runs keep TF32 off in torch (cstorch's default
is full fp32 as well); bf16 runs use torch autocast and cstorch mixed precision. Extra XLA
options reach the JAX children through ``XLA_FLAGS`` (e.g. ``--xla_gpu_autotune_level=0``).

    python benchmarks/bench_gpu.py [--json PATH] [--workloads gpt2s,small]
        [--engines eager,compile,cstorch] [--precisions fp32,bf16] [--steps 20]
    python benchmarks/bench_gpu.py --smoke     # tiny sizes on CPU, under a minute

Runs from the source tree on a machine that can install nothing (``PYTHONPATH`` is set for
the children; without ``hdf5plugin``, which only checkpoints need, a stand-in lets cstorch
import). The JAX children run with ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless set, so
that their peak memory is what they use.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORKLOADS = {
    "gpt2s": dict(vocab=50304, d=768, heads=12, layers=12, seq=1024, batch=8),
    "small": dict(vocab=512, d=256, heads=4, layers=2, seq=128, batch=16),
    "tiny": dict(vocab=128, d=64, heads=2, layers=2, seq=32, batch=4),  # --smoke
}
ENGINES = ("eager", "compile", "cstorch")
PRECISIONS = ("fp32", "bf16")

# Dense peak TFLOP/s by GPU: (name fragment, bf16 tensor core, fp32 without tensor cores).
# The first fragment found in the device name wins (so "H100 PCIe" before "H100").
PEAK_TFLOPS = (
    ("H100 PCIe", 756.0, 51.2),
    ("H100", 989.4, 66.9),
    ("H200", 989.4, 66.9),
    ("GH200", 989.4, 66.9),
    ("A100", 312.0, 19.5),
    ("L40S", 362.1, 91.6),
    ("A10G", 70.0, 31.2),
)


def peak_tflops(device_name: str | None, precision: str) -> float | None:
    """The GPU's dense peak for ``precision`` ("bf16": tensor cores; "fp32": without
    TF32), or None for a device not in the table (MFU is then not given)."""
    for fragment, bf16, fp32 in PEAK_TFLOPS:
        if device_name and fragment.lower() in device_name.lower():
            return bf16 if precision == "bf16" else fp32
    return None


def model_flops_per_step(spec, parameters: int, embedding: int) -> float:
    tokens = spec["batch"] * spec["seq"]
    per_token = 6 * (parameters - embedding) + 12 * spec["layers"] * spec["d"] * spec["seq"]
    return float(per_token * tokens)


# ----------------------------------------------------------------------------- the model
def build(spec):
    """(model, inputs, targets, loss_fn), seeded; CPU tensors."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, -1)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    torch.manual_seed(0)
    vocab, d = spec["vocab"], spec["d"]
    model = nn.Sequential(
        nn.Embedding(vocab, d),
        *[Block(d, spec["heads"]) for _ in range(spec["layers"])],
        nn.LayerNorm(d),
        nn.Linear(d, vocab),
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (spec["batch"], spec["seq"]), generator=g)
    y = torch.randint(0, vocab, (spec["batch"], spec["seq"]), generator=g)

    def loss_fn(m, x_, y_):
        return F.cross_entropy(m(x_).reshape(-1, vocab).float(), y_.reshape(-1))

    return model, x, y, loss_fn


# ------------------------------------------------------------------------------ children
def _windows(run_window, steps):
    """ms per step of ``steps`` steps in windows of about five (median over windows)."""
    window = max(1, min(5, steps))
    times = []
    for _ in range(max(1, steps // window)):
        t0 = time.perf_counter()
        run_window(window)
        times.append((time.perf_counter() - t0) / window)
    return statistics.median(times) * 1e3, [round(t * 1e3, 2) for t in times]


def run_torch(spec, precision, steps, compiled):
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if device == "cuda":
        torch.zeros(1, device=device).item()  # CUDA's start is not the step's (as for JAX)
    t0 = time.perf_counter()
    model, x, y, loss_fn = build(spec)
    model, x, y = model.to(device), x.to(device), y.to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, weight_decay=0.01, fused=device == "cuda"
    )

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn(model, x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    if compiled:
        step = torch.compile(step)
    loss = step()
    loss.item()
    first = time.perf_counter() - t0
    step().item()

    def window(n):
        nonlocal loss
        for _ in range(n):
            loss = step()
        loss.item()

    ms, spread = _windows(window, steps)
    result = {
        "ms_per_step": ms,
        "spread_ms": spread,
        "first_step_s": first,
        "loss": float(loss.item()),
        "device": device,
    }
    if device == "cuda":
        result["device_name"] = torch.cuda.get_device_name()
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result, model


def traced_step(model, backend, loss_fn):
    """(AdamW, the traced cstorch training step) this benchmark and step_cost.py time: the
    workload's loss, backward, AdamW (lr 1e-4, weight decay 0.01)."""
    import cerebras.pytorch as cstorch

    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    @cstorch.trace
    def step(x_, y_):
        loss = loss_fn(compiled, x_, y_)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return optimizer, step


def _allow_missing_hdf5plugin():
    """cstorch imports hdf5plugin for LZ4 checkpoints; this benchmark writes none."""
    try:
        import hdf5plugin  # noqa: F401
    except ImportError:
        import types

        sys.modules["hdf5plugin"] = types.ModuleType("hdf5plugin")
        return True
    return False


def run_cstorch(spec, precision, steps):
    import jax
    import jax.numpy as jnp

    stand_in = _allow_missing_hdf5plugin()
    import cerebras.pytorch as cstorch

    sys.path.insert(0, HERE)
    from bench_engine import _FirstStepSplit

    jnp.zeros(()).block_until_ready()  # the runtime's start is not the step's
    split = _FirstStepSplit()
    on_gpu = bool(jax.devices()[0].platform == "gpu")
    if precision == "bf16":
        cstorch.amp.set_half_dtype("bfloat16")
    t0 = time.perf_counter()
    model, x, y, loss_fn = build(spec)
    backend = cstorch.backend(
        "GPU" if on_gpu else "CPU",
        artifact_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "cstorch_bench_gpu"),
    )
    optimizer, step = traced_step(model, backend, loss_fn)

    warmup = 2
    total = warmup + max(1, min(5, steps)) * max(1, steps // max(1, min(5, steps)))
    batches = [(x, y)] * total
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: batches), num_steps=total
    )
    result = {
        "device": jax.devices()[0].platform,
        "device_name": getattr(jax.devices()[0], "device_kind", None),
        "hdf5plugin_stand_in": stand_in,
    }
    times, loss, first = [], None, None
    window = max(1, min(5, steps))
    t_window = None
    iterator = iter(executor)
    for i, (xb, yb) in enumerate(iterator):
        loss = step(xb, yb)
        if i == 0:
            loss.jax_array.block_until_ready()
            first = time.perf_counter() - t0
        if i == warmup - 1:
            loss.jax_array.block_until_ready()
            t_window = time.perf_counter()
        elif i >= warmup and (i - warmup + 1) % window == 0:
            loss.jax_array.block_until_ready()
            now = time.perf_counter()
            times.append((now - t_window) / window)
            t_window = now
        if i == total - 1:
            t_end = time.perf_counter()  # what follows is the executor's end of run
    run_end = time.perf_counter() - t_end
    t0 = time.perf_counter()
    model.state_dict()
    optimizer.state_dict()
    state_sync = time.perf_counter() - t0
    result.update(
        ms_per_step=statistics.median(times) * 1e3,
        spread_ms=[round(t * 1e3, 2) for t in times],
        first_step_s=first,
        first_step_split_s={k: round(v, 3) for k, v in split.seconds.items()},
        run_end_sync_s=run_end,
        state_sync_s=state_sync,
        loss=float(loss.materialize()),
        traces=step.trace_count,
    )
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        result["peak_memory_gib"] = stats["peak_bytes_in_use"] / 2**30
    return result, model


def child(spec_text):
    engine, workload, precision, steps = spec_text.split(":")
    spec = WORKLOADS[workload]
    if engine == "cstorch":
        result, model = run_cstorch(spec, precision, int(steps))
    else:
        result, model = run_torch(spec, precision, int(steps), compiled=engine == "compile")
    parameters = sum(p.numel() for p in model.parameters())
    embedding = model[0].weight.numel()
    flops = model_flops_per_step(spec, parameters, embedding)
    tokens = spec["batch"] * spec["seq"]
    seconds = result["ms_per_step"] / 1e3
    peak = peak_tflops(result.get("device_name"), precision) if result["device"] != "cpu" else None
    result.update(
        engine=engine,
        workload=workload,
        precision=precision,
        parameters_M=round(parameters / 1e6, 1),
        tokens_per_s=tokens / seconds,
        model_tflops=flops / seconds / 1e12,
        peak_tflops=peak,
        mfu=(flops / seconds / 1e12 / peak) if peak else None,
    )
    print("RESULT " + json.dumps(result), flush=True)


# -------------------------------------------------------------------------------- parent
def _environment():
    sys.path.insert(0, HERE)
    from bench_engine import _environment as environment

    return environment()


def measure(engine, workload, precision, steps, timeout, smoke):
    """One run in a fresh interpreter; ``{"error": ...}`` when it fails."""
    env = dict(os.environ)
    path = [ROOT, os.path.join(ROOT, "compat")]
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("CSTORCH_GRAPH_CACHE", "off")  # a cold first step
    if smoke:
        env["JAX_PLATFORMS"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # eager torch on a busy CPU
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        f"{engine}:{workload}:{precision}:{steps}",
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {
            "engine": engine,
            "workload": workload,
            "precision": precision,
            "error": f"timed out after {timeout} s",
        }
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (out.stderr or out.stdout).strip().splitlines()[-12:]
    return {
        "engine": engine,
        "workload": workload,
        "precision": precision,
        "error": "\n".join(tail) or f"exit status {out.returncode}",
    }


def _fmt(value, spec):
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def print_table(results):
    header = (
        f"{'workload':8s} {'prec':4s} {'engine':8s} {'ms/step':>8s} {'tokens/s':>9s} "
        f"{'TFLOP/s':>8s} {'MFU':>6s} {'first s':>8s} {'run end s':>9s} "
        f"{'state s':>8s} {'peak GiB':>8s}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        if "error" in r:
            print(
                f"{r['workload']:8s} {r['precision']:4s} {r['engine']:8s} failed: "
                f"{r['error'].splitlines()[-1][:80]}"
            )
            continue
        print(
            f"{r['workload']:8s} {r['precision']:4s} {r['engine']:8s} "
            f"{_fmt(r['ms_per_step'], '8.2f')} {_fmt(r['tokens_per_s'], '9.0f')} "
            f"{_fmt(r['model_tflops'], '8.1f')} "
            f"{(format(r['mfu'] * 100, '5.1f') + '%') if r.get('mfu') else '     -'} "
            f"{_fmt(r['first_step_s'], '8.2f')} {_fmt(r.get('run_end_sync_s'), '9.3f')} "
            f"{_fmt(r.get('state_sync_s'), '8.3f')} {_fmt(r.get('peak_memory_gib'), '8.2f')}"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--workloads", default="gpt2s,small")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per run")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes on CPU (eager and cstorch unless --engines is given)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    workloads, engines, steps = args.workloads.split(","), args.engines.split(","), args.steps
    if args.smoke:
        workloads, steps = ["tiny"], min(steps, 5)
        if "--engines" not in (argv if argv is not None else sys.argv[1:]):
            engines = ["eager", "cstorch"]  # torch.compile's first C++ build takes minutes
    for name, allowed, chosen in (
        ("workload", WORKLOADS, workloads),
        ("engine", ENGINES, engines),
        ("precision", PRECISIONS, args.precisions.split(",")),
    ):
        unknown = [c for c in chosen if c not in allowed]
        if unknown:
            parser.error(f"unknown {name} {unknown}; choose from {list(allowed)}")
    results = []
    for workload in workloads:
        for precision in args.precisions.split(","):
            for engine in engines:
                print(f"  {workload} {precision} {engine} ...", file=sys.stderr, flush=True)
                results.append(
                    measure(engine, workload, precision, steps, args.timeout, args.smoke)
                )
    print_table(results)
    report = {
        "environment": _environment(),
        "smoke": args.smoke,
        "steps": steps,
        "workloads": {w: WORKLOADS[w] for w in workloads},
        "results": results,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
