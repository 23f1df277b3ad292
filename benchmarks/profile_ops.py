"""Where a training step's time goes, by op class: cstorch's compiled step (JAX's profiler over
XLA's optimized HLO) or eager torch (torch's profiler), on the CPU or a GPU.

    python benchmarks/profile_ops.py [--engine cstorch|eager] [--workload transformer]
        [--precision fp32|bf16] [--steps 5] [--top 15] [--json PATH]

Workloads: bench_engine.py's (``mlp``, ``transformer``, ``gpt2-small``) and bench_gpu.py's
(``gpt2s``, ``small``, ``tiny``). For cstorch, XLA dumps the optimized HLO of the step into a
temporary directory (``XLA_FLAGS=--xla_dump_to``, set before JAX starts), and each profiled
event that names an HLO instruction (``hlo_op``) is put in a class by what that instruction
is: a matmul (a dot, a cuBLAS/oneDNN/XNNPACK GEMM, a Triton GEMM fusion), attention (a cuDNN
fused-attention call), a reduction fusion (softmax, layer norm, bias gradients), an
elementwise fusion, a layout change (copy, transpose), a gather/scatter, a collective, ...
The report gives the classes by total time per step and the ``--top`` single instructions.
Times on a CPU are summed over threads (an op that runs on two cores counts twice).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (HERE, ROOT, os.path.join(ROOT, "compat")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

GPT_WORKLOADS = ("gpt2s", "small", "tiny")  # bench_gpu.py
ENGINE_WORKLOADS = ("mlp", "transformer", "gpt2-small", "gpt", "cnn")  # bench_engine.py


# ---------------------------------------------------------------- the optimized HLO's ops
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")


def parse_hlo(text: str) -> tuple[dict, dict]:
    """({instruction: (opcode, rest of line)}, {computation: [opcodes in it]}) of HLO text."""
    instructions, computations, current = {}, {}, None
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            name, _shape, opcode, rest = match.groups()
            instructions[name] = (opcode, rest)
            if current is not None:
                computations[current].append(opcode)
            continue
        match = _COMPUTATION.match(line)
        if match and "->" in line or (match and line.lstrip().startswith("ENTRY")):
            current = match.group(1)
            computations[current] = []
        elif line.strip() == "}":
            current = None
    return instructions, computations


def classify(name: str, instructions: dict, computations: dict) -> str:
    """The op class of one HLO instruction (by its name in the optimized module)."""
    entry = instructions.get(name)
    if entry is None:
        lowered = name.lower()
        if "gemm" in lowered or "dot" in lowered or "matmul" in lowered:
            return "matmul"
        if "fusion" in lowered:
            return "fusion (not in the dump)"
        return "other (not in the dump)"
    opcode, rest = entry
    lowered = rest.lower()
    if opcode == "custom-call":
        target = re.search(r'custom_call_target="([^"]+)"', rest)
        target = (target.group(1) if target else "").lower()
        if "fmha" in target or "attention" in target:
            return "attention (cuDNN)"
        if "gemm" in target or "matmul" in target or "cublas" in target:
            return "matmul"
        if "conv" in target:
            return "convolution"
        return f"custom-call {target or '?'}"
    if opcode in ("dot",):
        return "matmul"
    if opcode == "convolution":
        return "convolution"
    if opcode in ("copy", "transpose", "copy-start", "copy-done", "bitcast"):
        return "layout (copy/transpose)"
    if opcode in (
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "all-to-all",
        "collective-permute",
        "all-reduce-start",
        "all-reduce-done",
    ):
        return "collective"
    if opcode in ("gather", "scatter", "dynamic-slice", "dynamic-update-slice"):
        return "gather/scatter"
    if opcode == "reduce":
        return "reduction"
    if opcode == "fusion":
        if "__triton_gemm" in lowered or "triton_gemm" in lowered:
            return "matmul"
        if "__cudnn$fusion" in lowered or "cudnn" in lowered:
            return "attention (cuDNN)" if "fmha" in lowered else "cuDNN fusion"
        called = re.search(r"calls=%?([\w.\-]+)", rest)
        body = computations.get(called.group(1), []) if called else []
        if "dot" in body or "custom-call" in body and "gemm" in lowered:
            return "matmul"
        if "convolution" in body:
            return "convolution"
        if "scatter" in body or "gather" in body:
            return "gather/scatter"
        if "reduce" in body or "kind=kinput" in lowered:
            return "reduction fusion"
        if body and set(body) <= {
            "parameter",
            "copy",
            "transpose",
            "bitcast",
            "reshape",
            "broadcast",
            "tuple",
            "get-tuple-element",
            "slice",
            "concatenate",
            "pad",
        }:
            return "layout (copy/transpose)"
        return "elementwise fusion"
    return opcode


def read_dumped_hlo(dump_dir: str, module_hint: str = "pure_step") -> str:
    """The largest optimized-HLO text in the dump whose file name has ``module_hint``."""
    files = [
        f
        for f in glob.glob(os.path.join(dump_dir, "*after_optimizations.txt"))
        if module_hint in os.path.basename(f)
    ]
    if not files:
        files = glob.glob(os.path.join(dump_dir, "*after_optimizations.txt"))
    if not files:
        return ""
    with open(max(files, key=os.path.getsize)) as f:
        return f.read()


def profile_events(trace_dir: str, module_hint: str = "pure_step"):
    """[(hlo_op, duration_ns, place)] of every profiled event of the step's HLO module."""
    import jax
    from jax.profiler import ProfileData

    if not hasattr(ProfileData, "from_file"):  # JAX 0.7 has the name, without a reader
        raise SystemExit(
            f"reading the profile needs jax.profiler.ProfileData.from_file, which "
            f"JAX {jax.__version__} lacks (JAX 0.10 has it); upgrade JAX."
        )
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    events = []
    for path in paths:
        data = ProfileData.from_file(path)
        for plane in data.planes:
            for line in plane.lines:
                for event in line.events:
                    stats = {name: value for name, value in event.stats}
                    op, module = stats.get("hlo_op"), str(stats.get("hlo_module", ""))
                    if op and module_hint in module:
                        events.append((str(op), float(event.duration_ns), plane.name))
    return events


def summarize(events, instructions, computations, steps, top):
    device_planes = {p for _, _, p in events if "GPU" in p or "device" in p}
    if device_planes:  # a GPU: its kernels, not the host's launch records
        events = [e for e in events if e[2] in device_planes]
    by_class, by_op = collections.Counter(), collections.Counter()
    for op, ns, _ in events:
        by_class[classify(op, instructions, computations)] += ns
        by_op[op] += ns
    total = sum(by_class.values()) or 1.0
    classes = [
        {"class": c, "ms_per_step": ns / 1e6 / steps, "share": ns / total}
        for c, ns in by_class.most_common()
    ]
    ops = [
        {"op": o, "class": classify(o, instructions, computations), "ms_per_step": ns / 1e6 / steps}
        for o, ns in by_op.most_common(top)
    ]
    return {
        "total_ms_per_step": total / 1e6 / steps,
        "classes": classes,
        "top_ops": ops,
        "places": sorted({p for _, _, p in events}),
    }


# ------------------------------------------------------------------------------ engines
def _step_and_batch(workload, precision):
    """(a function running one training step and returning its loss, a blocking read)."""
    import cerebras.pytorch as cstorch

    if precision == "bf16":
        cstorch.amp.set_half_dtype("bfloat16")
    import jax

    platform = jax.devices()[0].platform
    backend = cstorch.backend(
        "GPU" if platform == "gpu" else "CPU",
        artifact_dir=os.path.join(tempfile.gettempdir(), "cstorch_prof"),
    )
    if workload in GPT_WORKLOADS:
        import bench_gpu

        model, x, y, loss_fn = bench_gpu.build(bench_gpu.WORKLOADS[workload])
        _, step = bench_gpu.traced_step(model, backend, loss_fn)
        batch = (x, y)
    else:
        import bench_engine

        model, batch, loss_fn, kind = bench_engine._workload(workload)
        compiled = cstorch.compile(model, backend)
        step = cstorch.trace(
            bench_engine.training_step(
                compiled, loss_fn, bench_engine._optimizer(cstorch.optim, kind, model)
            )
        )
    return (lambda: step(*batch)), (lambda loss: loss.jax_array.block_until_ready())


def profile_cstorch(workload, precision, steps, top):
    dump = tempfile.mkdtemp(prefix="cstorch_hlo_")
    flags = os.environ.get("XLA_FLAGS", "")
    # On a GPU, XLA replays the step as CUDA graphs ("command buffers"), which the profiler sees
    # as one event: off here, so that every kernel is its own event (the step runs a little
    # slower; wall_ms_per_step is measured under the same setting).
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_dump_to={dump} --xla_dump_hlo_as_text --xla_gpu_enable_command_buffer="
    ).strip()
    import jax

    run, wait = _step_and_batch(workload, precision)
    t0 = time.perf_counter()
    wait(run())
    first = time.perf_counter() - t0
    for _ in range(2):
        loss = run()
    wait(loss)
    t0, usage = time.perf_counter(), _kernel_usage()
    for _ in range(steps):
        loss = run()
    wait(loss)
    unprofiled = (time.perf_counter() - t0) / steps
    kernel = usage.per_step(steps)
    trace_dir = tempfile.mkdtemp(prefix="cstorch_trace_")
    with jax.profiler.trace(trace_dir):
        for _ in range(steps):
            loss = run()
        wait(loss)
    instructions, computations = parse_hlo(read_dumped_hlo(dump))
    report = summarize(profile_events(trace_dir), instructions, computations, steps, top)
    report.update(
        engine="cstorch",
        platform=jax.devices()[0].platform,
        device=str(getattr(jax.devices()[0], "device_kind", "")),
        first_step_s=first,
        wall_ms_per_step=unprofiled * 1e3,
        hlo_instructions=len(instructions),
        **kernel,
    )
    return report


_TORCH_CLASSES = (
    ("attention", ("attention", "sdpa", "flash", "efficient_attention", "softmax")),
    ("matmul", ("mm", "addmm", "bmm", "matmul", "linear", "gemm", "baddbmm")),
    ("convolution", ("conv",)),
    ("norm", ("layer_norm", "batch_norm", "native_layer_norm", "group_norm")),
    ("optimizer", ("_foreach", "adam", "sgd", "lerp", "addcdiv", "addcmul")),
    ("reduction", ("sum", "mean", "amax", "max", "nll_loss", "log_softmax")),
    (
        "layout (copy/transpose)",
        (
            "copy_",
            "clone",
            "contiguous",
            "transpose",
            "permute",
            "to",
            "_to_copy",
            "view",
            "reshape",
            "t",
            "expand",
        ),
    ),
    ("gather/scatter", ("embedding", "index", "gather", "scatter")),
)


def torch_class(name: str) -> str:
    short = name.split("::")[-1].lower()
    for label, keys in _TORCH_CLASSES:
        if any(
            short == k or short.startswith(k + "_") or (len(k) > 3 and k in short) for k in keys
        ):
            return label
    return "elementwise"


_KERNEL_CLASSES = (
    ("attention", ("sdpa", "fmha", "flash", "attention")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul")),
    ("convolution", ("conv",)),
    ("norm", ("layer_norm", "gammabeta", "layernorm", "batch_norm")),
    ("reduction (softmax, sums)", ("softmax", "reduce_kernel", "reduce")),
    ("optimizer", ("multi_tensor_apply", "foreach", "adam")),
    ("layout (copy/transpose)", ("copy", "transpose", "memcpy", "memset", "cat")),
    ("gather/scatter", ("index", "gather", "scatter", "embedding")),
)


def kernel_class(name: str) -> str:
    """The op class of a CUDA kernel launched by eager torch, by its name."""
    lowered = name.lower()
    for label, keys in _KERNEL_CLASSES:
        if any(k in lowered for k in keys):
            return label
    return "elementwise"


def profile_eager(workload, precision, steps, top):
    import torch
    from torch.profiler import ProfilerActivity, profile

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if workload in GPT_WORKLOADS:
        import bench_gpu

        model, x, y, loss_fn = bench_gpu.build(bench_gpu.WORKLOADS[workload])
        model, x, y = model.to(device), x.to(device), y.to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

        def step():
            with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = loss_fn(model, x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss
    else:
        import bench_engine

        model, (x, y), loss_fn, kind = bench_engine._workload(workload)
        step_fn = bench_engine.training_step(
            model, loss_fn, bench_engine._optimizer(torch.optim, kind, model)
        )

        def step():
            with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16"):
                return step_fn(x, y)

    for _ in range(3):
        step()
    t0, usage = time.perf_counter(), _kernel_usage()
    for _ in range(steps):
        step().item()
    wall = (time.perf_counter() - t0) / steps
    kernel = usage.per_step(steps)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step().item()
    by_class, by_op = collections.Counter(), collections.Counter()
    for event in prof.key_averages():
        if device == "cuda":  # the GPU's kernels (the ATen calls that launch them aside)
            if str(getattr(event, "device_type", "")).split(".")[-1] != "CUDA":
                continue
            us, label = event.self_device_time_total, kernel_class(event.key)
        else:  # ATen's self time, so that nested calls are not counted twice
            if not event.key.startswith("aten::"):
                continue
            us, label = event.self_cpu_time_total, torch_class(event.key)
        by_class[label] += us
        by_op[event.key] += us
    total = sum(by_class.values()) or 1.0
    return {
        "engine": "eager",
        "platform": device,
        "wall_ms_per_step": wall * 1e3,
        **kernel,
        "total_ms_per_step": total / 1e3 / steps,
        "classes": [
            {"class": c, "ms_per_step": us / 1e3 / steps, "share": us / total}
            for c, us in by_class.most_common()
        ],
        "top_ops": [
            {
                "op": o,
                "class": (kernel_class if device == "cuda" else torch_class)(o),
                "ms_per_step": us / 1e3 / steps,
            }
            for o, us in by_op.most_common(top)
        ],
    }


def _kernel_usage():
    """Page faults and kernel CPU time from here on (``per_step(steps)``): the cost of memory
    mapped afresh, which the op profile spreads over whichever op first touches a page
    (cpu_results.md); bench_engine.py measures it the same way."""
    from bench_engine import _KernelUsage

    return _KernelUsage()


def print_report(report):
    print(
        f"{report['engine']} on {report['platform']} {report.get('device', '')}: "
        f"{report['wall_ms_per_step']:.2f} ms/step unprofiled, "
        f"{report['total_ms_per_step']:.2f} ms/step of profiled op time"
    )
    print(
        f"  kernel (page faults, mapping): {report['sys_ms_per_step']:.1f} ms/step of CPU, "
        f"{report['faults_per_step']:.0f} page faults/step (unprofiled steps; inside the op "
        "times of whichever ops first touch fresh pages)"
    )
    print(f"  {'op class':28s} {'ms/step':>9s} {'share':>6s}")
    for row in report["classes"]:
        print(f"  {row['class']:28s} {row['ms_per_step']:9.3f} {row['share'] * 100:5.1f}%")
    print("  top ops:")
    for row in report["top_ops"]:
        print(f"    {row['op'][:48]:48s} {row['class']:24s} {row['ms_per_step']:8.3f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("cstorch", "eager"), default="cstorch")
    parser.add_argument(
        "--workload", default="transformer", choices=GPT_WORKLOADS + ENGINE_WORKLOADS
    )
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.engine == "cstorch":
        try:
            import hdf5plugin  # noqa: F401
        except ImportError:  # a GPU machine without it: this script writes no checkpoint
            import types

            sys.modules["hdf5plugin"] = types.ModuleType("hdf5plugin")
        report = profile_cstorch(args.workload, args.precision, args.steps, args.top)
    else:
        report = profile_eager(args.workload, args.precision, args.steps, args.top)
    report.update(workload=args.workload, precision=args.precision, steps=args.steps)
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
