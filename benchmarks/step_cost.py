"""Where a cstorch step's first-call time goes, and what XLA says the compiled step costs,
without a GPU: the bench_gpu.py model compiled on this machine's platform.

Prints (and with ``--json`` writes) the first-step phases (capture, lowering to a jaxpr, MLIR,
XLA compile), XLA's cost analysis of the compiled step (FLOPs, bytes accessed), and the
result dtypes of its dot products: in the StableHLO the step is lowered to (what the model
asks for) and in XLA's optimized HLO (what this platform's compiler made of it; XLA on CPU
computes half dots in fp32 and converts, so the StableHLO is the one to compare across
versions). ``--as-cuda`` also lowers the step for an NVIDIA GPU (lowering only; cuDNN's
trace-time version checks are answered as a Hopper GPU with cuDNN 9.10 would) and counts its
dots and cuDNN calls.

``--run`` makes the first call a real step instead (through ``@cstorch.trace``, so the graph
and XLA caches are used when enabled: run it twice with ``CSTORCH_GRAPH_CACHE=DIR`` and
``CSTORCH_COMPILATION_CACHE=DIR`` for the second-run numbers).

    python benchmarks/step_cost.py [--workload gpt2s] [--precision bf16] [--batch 8]
        [--as-cuda] [--run] [--json PATH]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_gpu import WORKLOADS, _allow_missing_hdf5plugin, build, traced_step  # noqa: E402


def dot_result_types(text: str) -> dict:
    """Result element types of the dots in StableHLO or HLO text."""
    types = collections.Counter()
    for m in re.finditer(r"stablehlo\.dot_general .*-> tensor<[^>]*x(\w+)>", text):
        types[m.group(1)] += 1
    for m in re.finditer(r"= (\w+)\[[^\]]*\][^=]* dot\(", text):
        types[m.group(1)] += 1
    return dict(types)


def custom_calls(text: str) -> dict:
    names = re.findall(r"custom_call @([\w$]+)", text) + re.findall(
        r'custom_call_target="([^"]+)"', text
    )
    return dict(collections.Counter(names))


def _state_specs(program):
    import jax

    from jax_backend.dtypes import to_jax_dtype

    nodes = [n for n in program.captured.graph.graph.nodes if n.op == "placeholder"]
    return [
        jax.ShapeDtypeStruct(tuple(n.meta["val"].shape), to_jax_dtype(n.meta["val"].dtype))
        for n in nodes[: len(program.captured.used_state)]
    ]


def _cpu_timers() -> dict:
    """Process CPU seconds (all threads) spent in capture, in lowering (the interpreter under
    jit's trace), in uploading state and in the first run's state backup: on a shared
    machine these are steadier than wall time."""
    import cstorch.core.step_capture as step_capture
    from jax_backend import DeviceState, Program

    seconds = collections.Counter()

    def timed(phase, fn):
        def wrapper(*args, **kwargs):
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[phase] += time.process_time() - t0

        return wrapper

    step_capture.capture_step = timed("capture", step_capture.capture_step)
    Program.pure_step = timed("lowering", Program.pure_step)
    DeviceState.arrays = timed("state_upload", DeviceState.arrays)
    DeviceState.hold_in_torch = timed("first_run_backup", DeviceState.hold_in_torch)
    return seconds


def _answer_cudnn_checks():
    import jax._src.cudnn.fused_attention_stablehlo as fused

    fused.check_cudnn_version = lambda: 91000
    fused.check_compute_capability = lambda capability: True
    fused.is_cuda_compute_capability_equal = lambda capability: False


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt2s", choices=sorted(WORKLOADS))
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--batch", type=int, help="override the workload's batch size")
    parser.add_argument("--seq", type=int, help="override the workload's sequence length")
    parser.add_argument("--as-cuda", action="store_true")
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    _allow_missing_hdf5plugin()
    from bench_engine import _FirstStepSplit

    import cerebras.pytorch as cstorch

    jnp.zeros(()).block_until_ready()
    split = _FirstStepSplit()
    cpu = _cpu_timers()
    spec = dict(WORKLOADS[args.workload])
    if args.batch:
        spec["batch"] = args.batch
    if args.seq:
        spec["seq"] = args.seq
    if args.precision == "bf16":
        cstorch.amp.set_half_dtype("bfloat16")
    model, x, y, loss_fn = build(spec)
    on_gpu = jax.devices()[0].platform == "gpu"
    backend = cstorch.backend("GPU" if on_gpu else "CPU", artifact_dir="/tmp/cstorch_step_cost")
    _, step = traced_step(model, backend, loss_fn)

    report = {
        "workload": args.workload,
        "spec": spec,
        "precision": args.precision,
        "platform": jax.devices()[0].platform,
    }
    t0, c0 = time.perf_counter(), time.process_time()
    if args.run:
        float(step(x, y).materialize())
        program = step.programs[0]
        report["first_step_s"] = time.perf_counter() - t0
        report["first_step_cpu_s"] = time.process_time() - c0
        report["phases_s"] = {k: round(v, 2) for k, v in split.seconds.items()}
        report["cpu_s"] = {k: round(v, 2) for k, v in cpu.items()}
    else:  # capture and compile only (a GPT-2-size step takes minutes on a CPU)
        step.compile_only(x, y)
        program = step.programs[-1]
    used, inputs = _state_specs(program), program.input_specs()
    lowered = program.lower(used, inputs)
    stablehlo = lowered.as_text()
    t1, c1 = time.perf_counter(), time.process_time()
    executable = lowered.compile()
    if not args.run:
        report["capture_lower_compile_s"] = time.perf_counter() - t0
        report["capture_lower_compile_cpu_s"] = time.process_time() - c0
        report["cpu_s_xla_compile"] = time.process_time() - c1
    else:  # compiled again (or found in the XLA cache) for the introspection below
        report["recompile_s"] = time.perf_counter() - t1
    if not args.run:
        report["phases_s"] = {k: round(v, 2) for k, v in split.seconds.items()}
        report["cpu_s"] = {k: round(v, 2) for k, v in cpu.items()}
    cost = executable.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    report["cost"] = {k: cost.get(k) for k in ("flops", "bytes accessed", "transcendentals")}
    optimized = executable.as_text()
    report["stablehlo_dots"] = dot_result_types(stablehlo)
    report["optimized_hlo_dots"] = dot_result_types(optimized)
    report["optimized_hlo_custom_calls"] = custom_calls(optimized)
    if args.as_cuda:
        _answer_cudnn_checks()
        cuda = jax_backend_program_for(program, "cuda")
        donated, kept = cuda.split_state(used)
        text = (
            cuda._jitted.trace(donated, kept, inputs, 0)
            .lower(lowering_platforms=("cuda",))
            .as_text()
        )
        report["cuda_stablehlo_dots"] = dot_result_types(text)
        report["cuda_stablehlo_custom_calls"] = custom_calls(text)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def jax_backend_program_for(program, platform):
    """The same captured step as a program lowered for ``platform``."""
    from jax_backend import Program

    return Program(program.captured, program.policy, platform=platform)


if __name__ == "__main__":
    main()
