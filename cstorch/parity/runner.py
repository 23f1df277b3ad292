"""The ``python -m cstorch.parity`` command: run each engine in a subprocess, compare, report."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

from cstorch import config
from cstorch.parity import record
from cstorch.parity.compare import compare_closures, compare_state, first_divergence, table

# name -> (engine, backend) of cstorch.parity.record: the backend that serves every
# cstorch.backend(...) of the script, with that engine. "csx" is the modeled wafer (on JAX's
# CPU devices), in float32 unless --csx-mixed-precision.
ENGINES = {
    "eager": ("eager", "cpu"),
    "jax-cpu": ("jax", "cpu"),
    "jax-gpu": ("jax", "gpu"),
    "csx": ("jax", "csx"),
}


def available_engines() -> list:
    """The default engines: eager and JAX on CPU; JAX on GPU too when JAX sees a GPU (CSX is
    compared when asked for: ``--engines eager,csx``)."""
    from jax_backend import mesh

    return ["eager", "jax-cpu"] + (["jax-gpu"] if mesh.devices("gpu") else [])


#: Relative tolerance of closure values by the precision a value was computed in (its own
#: dtype, or the half dtype of a mixed-precision run): a few units of that precision's
#: rounding, which different kernels (eager torch on CPU, XLA on CPU or GPU) legitimately
#: differ by. The final state gets ten times as much (it accumulates every step's rounding).
RTOL_BY_PRECISION = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1e-2}
STATE_FACTOR = 10

#: Final state the reference engine cannot reproduce itself is judged against that: when a
#: tensor differs by more than the state tolerance, the reference is run once more with its
#: parameters moved by about one rounding step (``record.PERTURBATION``). A tensor that rerun
#: changes by NOISE_DOMINATED or more (relative) follows rounding noise, not the data (a
#: gradient that is zero in exact arithmetic, as a bias before BatchNorm gets, which Adam
#: scales to full-size steps): no engine reproduces it, and it is named instead of judged.
#: Any other tensor passes if it differs by at most NOISE_FACTOR times what the rerun changed
#: (most change by about the perturbation and keep the state tolerance).
NOISE_DOMINATED = 0.1
NOISE_FACTOR = 10


def precision_of(dtype: str, run_precision: str) -> str:
    """The precision a recorded value was computed in: the coarser of its dtype and the
    run's compute dtype (float32, float16 or bfloat16)."""
    order = ["float32", "float16", "bfloat16"]
    own = dtype if dtype in order else "float32"
    run = run_precision if run_precision in order else "float32"
    return max(own, run, key=order.index)


def run_engine(
    name: str,
    script: str,
    args,
    out: str,
    seed: int = 0,
    verbose: bool = False,
    timeout: float | None = None,
    cwd: str | None = None,
    perturb: bool = False,
    csx_mixed_precision: bool = False,
) -> subprocess.CompletedProcess:
    """Runs ``script args`` on one engine in a fresh Python process, recording into ``out``;
    ``cwd`` is its working directory (default: this process's); ``perturb`` moves the
    parameters by about one rounding step as they are set up (``record.PERTURBATION``). The
    csx engine runs in float32 (unless the script chooses a precision) without
    ``csx_mixed_precision``."""
    engine, backend = ENGINES[name]
    float32 = backend == "csx" and not csx_mixed_precision
    command = [
        sys.executable,
        "-m",
        "cstorch.parity.record",
        "--engine",
        engine,
        "--backend",
        backend,
        *(["--float32"] if float32 else []),
        "--seed",
        str(seed),
        "--out",
        out,
        *(["--perturb"] if perturb else []),
        os.path.abspath(script),
        *args,
    ]
    # Imports that work from here (python -m puts the working directory first) work there.
    path = os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH")] if p)
    env = dict(
        config.launched_process_environment(os.environ), CSTORCH_ENGINE=engine, PYTHONPATH=path
    )
    if verbose:
        return subprocess.run(command, env=env, timeout=timeout, cwd=cwd)
    return subprocess.run(
        command, env=env, timeout=timeout, capture_output=True, text=True, cwd=cwd
    )


def absolute_path_arguments(args) -> list:
    """The script's arguments with those that name an existing file or folder (relative to
    here) made absolute, so that they still name it from an engine's own working directory.
    ``--flag=path`` counts too."""
    result = []
    for arg in args:
        prefix, value = ("", arg)
        if arg.startswith("-") and "=" in arg:
            prefix, _, value = arg.partition("=")
            prefix += "="
        if (
            value
            and not os.path.isabs(value)
            and not value.startswith("-")
            and os.path.exists(value)
        ):
            value = os.path.abspath(value)
        result.append(prefix + value)
    return result


def _parse(argv):
    parser = argparse.ArgumentParser(
        prog="python -m cstorch.parity",
        description="Run a cstorch script on several engines and compare every value passed "
        "to its step closures and its final state.",
    )
    parser.add_argument(
        "--engines",
        default=None,
        help=f"comma-separated, the first is the reference; of "
        f"{', '.join(ENGINES)} (default: eager,jax-cpu, plus jax-gpu "
        "when JAX sees a GPU). Each engine's backend serves every "
        "cstorch.backend(...) of the script, whatever type it names; "
        "csx is the modeled wafer, run in float32 (see "
        "--csx-mixed-precision)",
    )
    parser.add_argument(
        "--csx-mixed-precision",
        action="store_true",
        help="run csx in its default float16 mixed precision (compared at "
        "float16's tolerance) instead of float32; a script that chooses "
        "a precision itself keeps it on every engine",
    )
    parser.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="relative tolerance per closure value (default: by precision, "
        + ", ".join(f"{k} {v:g}" for k, v in RTOL_BY_PRECISION.items())
        + ")",
    )
    parser.add_argument(
        "--atol",
        type=float,
        default=1e-6,
        help="absolute tolerance per closure value (default 1e-6)",
    )
    parser.add_argument(
        "--state-rtol",
        type=float,
        default=None,
        help="tolerance of the final state: max|a-b| / max|a| per tensor "
        f"(default: {STATE_FACTOR}x the closure tolerance of the run's "
        "precision)",
    )
    parser.add_argument(
        "--shared-workdir",
        action="store_true",
        help="run every engine in the current directory (default: each in "
        "its own empty working directory, so files a script writes to "
        "fixed relative paths do not collide or feed the next engine)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of random, numpy and torch")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per engine")
    parser.add_argument("--verbose", action="store_true", help="show the script's own output")
    parser.add_argument(
        "--json",
        default=None,
        metavar="PATH",
        help="also write the comparison (every row with its tolerance, and a "
        "summary per engine) as JSON",
    )
    parser.add_argument("script", help="the cstorch training script, run unchanged")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    options = parser.parse_args(argv)
    if not os.path.isfile(options.script):
        parser.error(f"no such script: {options.script}")
    engines = (
        available_engines()
        if options.engines is None
        else [e.strip() for e in options.engines.split(",") if e.strip()]
    )
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or len(engines) < 2:
        parser.error(
            f"--engines needs two or more of {', '.join(ENGINES)}; got {options.engines!r}"
        )
    options.engines = engines
    return options


def main(argv=None) -> int:
    """``python -m cstorch.parity SCRIPT [ARGS]``: runs the script once per engine and
    compares what they recorded; returns the exit status (0 within tolerance, 1 past it, 2
    when an engine failed)."""
    options = _parse(argv)
    runs, states, infos, warned = [], [], [], {}
    args = options.args if options.shared_workdir else absolute_path_arguments(options.args)
    made_absolute = [a for a, b in zip(options.args, args) if a != b]
    if made_absolute:
        print(
            f"arguments naming existing files, passed as absolute paths: {' '.join(made_absolute)}"
        )
    with tempfile.TemporaryDirectory(prefix="cstorch-parity-") as tmp:
        for name in options.engines:
            result = _record(name, options, args, tmp)
            if isinstance(result, int):
                return result
            closures, state, info, output = result
            runs.append(closures)
            states.append(state)
            infos.append(info)
            if not options.verbose:
                warned[name] = _warnings(output)
        return _report(options, runs, states, infos, warned, args, tmp)


def _record(name, options, args, tmp, perturb=False):
    """One engine's run: ``(closures, state, info, output)``, or the exit status after
    reporting its failure."""
    label = f"{name}-perturbed" if perturb else name
    out = os.path.join(tmp, f"{label}.npz")
    workdir = None
    if not options.shared_workdir:
        workdir = os.path.join(tmp, f"workdir-{label}")
        os.mkdir(workdir)
    what = (
        (
            f"on {name} again, its parameters moved by one rounding step (which final state "
            f"{name} reproduces itself)"
        )
        if perturb
        else f"on {name}"
    )
    print(
        f"running {options.script} {what} ..."
        + ("" if workdir is None else " (in its own working directory)"),
        flush=True,
    )
    try:
        result = run_engine(
            name,
            options.script,
            args,
            out,
            options.seed,
            options.verbose,
            options.timeout,
            cwd=workdir,
            perturb=perturb,
            csx_mixed_precision=options.csx_mixed_precision,
        )
    except subprocess.TimeoutExpired:
        print(f"error: the {label} run took longer than {options.timeout} s", file=sys.stderr)
        return 2
    if result.returncode != 0 or not os.path.exists(out):
        tail = "" if options.verbose else (result.stdout + result.stderr)[-4000:]
        print(
            f"error: the {label} run failed (exit status {result.returncode}):\n{tail}",
            file=sys.stderr,
        )
        if workdir is not None and "FileNotFoundError" in tail:
            print(
                "note: each engine runs in its own empty working directory; a file "
                "the script opens by a relative path that is not one of its "
                "arguments is not there. Give its absolute path, or run with "
                "--shared-workdir.",
                file=sys.stderr,
            )
        return 2
    closures, state, info = record.load_run(out)
    output = "" if options.verbose else result.stdout + result.stderr
    return closures, state, info, output


def _report(options, runs, states, infos, warned, args, tmp) -> int:
    """Compares the recorded runs (the first is the reference) and prints the verdict."""
    run_precision = precision_of(
        "float32", max((info["precision"] for info in infos), key=list(RTOL_BY_PRECISION).index)
    )
    rtols = {
        key: options.rtol
        if options.rtol is not None
        else RTOL_BY_PRECISION[precision_of(infos[0]["dtypes"].get(key, "float32"), run_precision)]
        for run in runs
        for key in run
    }
    state_rtol = (
        options.state_rtol
        if options.state_rtol is not None
        else STATE_FACTOR * RTOL_BY_PRECISION[run_precision]
    )
    rows = compare_closures(runs, rtols, options.atol)
    print()
    print(table(rows, options.engines))
    print()
    print(
        _tolerance_line(
            options, run_precision, rtols, state_rtol, [info["precision"] for info in infos]
        )
    )
    for name, lines in warned.items():
        for line in lines:
            print(f"warning from the {name} run: {line}")
    failed = False
    summaries = []
    reference = options.engines[0]
    noise = None  # {tensor: relative change in the reference's perturbed rerun}, run lazily
    steps = len({row.step for row in rows})
    random_ops = sorted({op for info in infos for op in info["random_ops"]})
    if not rows:
        print(
            "warning: the script passed no values to step closures; only the final state "
            "is compared"
        )
    for i, name in enumerate(options.engines[1:], start=1):
        worst = max((row.errors[i - 1] for row in rows), default=0.0)
        print(
            f"{name} vs {reference}: {len(rows)} values over {steps} steps, largest "
            f"relative difference {worst:.2e}"
        )
        diverged = first_divergence(rows, i)
        if diverged is not None:
            failed = True
            print(
                f"  FIRST DIVERGENCE at step {diverged.step}: {diverged.name} = "
                f"{_brief(diverged.values[i])} on {name}, {_brief(diverged.values[0])} on "
                f"{reference} (relative difference {diverged.errors[i - 1]:.2e}, tolerance "
                f"{rtols[(diverged.step, diverged.name)]:g})"
            )
            for cause in _likely_causes(
                diverged, rows, random_ops, run_precision, warned.get(name, [])
            ):
                print(f"  likely cause: {cause}")
        models = compare_state(
            *({k: v for k, v in s.items() if k.startswith("model")} for s in (states[0], states[i]))
        )
        print(
            f"  final parameters: largest difference in {models.name or '-'}: max|diff| "
            f"{models.max_abs:.3e}, relative {models.max_rel:.3e}"
        )
        state = compare_state(states[0], states[i])
        print(
            f"  final state (models and optimizers, {len(states[0])} tensors): largest "
            f"difference in {state.name or '-'}: max|diff| {state.max_abs:.3e}, relative "
            f"{state.max_rel:.3e} (tolerance {state_rtol:g})"
        )
        if state.missing:
            print(
                f"  state recorded by one engine only (or with different shapes): "
                f"{', '.join(state.missing[:5])}{' ...' if len(state.missing) > 5 else ''}"
            )
        beyond = state.beyond(state_rtol)
        noisy = []
        if beyond and not state.missing:
            if noise is None:
                noise = _noise(options, args, tmp, reference)
            noisy = [
                n
                for n in beyond
                if noise.get(n, 0.0) >= NOISE_DOMINATED
                or state.relative[n] <= NOISE_FACTOR * noise.get(n, 0.0)
            ]
            if noisy:
                _print_noise(noisy, state, noise, infos[0].get("names", {}), reference)
        unexplained = [n for n in beyond if n not in noisy]
        if noisy and not unexplained and not state.missing and diverged is None:
            print(
                "  likely cause: those tensors follow rounding noise: a gradient that is zero "
                "in exact arithmetic (e.g. the bias of a layer followed by BatchNorm) gets "
                "only rounding errors, which Adam-like optimizers scale to full-size steps. No "
                "engine, eager torch included, reproduces them; the losses and the rest of "
                "the state agree"
            )
        if unexplained:
            print(
                f"  beyond the tolerance, and not what {reference} itself varies by: "
                + ", ".join(f"{n} ({state.relative[n]:.2e})" for n in unexplained[:5])
                + (" ..." if len(unexplained) > 5 else "")
            )
        if unexplained or state.missing:
            failed = True
            if diverged is None:
                for cause in _likely_causes(
                    None, rows, random_ops, run_precision, warned.get(name, [])
                ):
                    print(f"  likely cause: {cause}")
        summaries.append(
            {
                "engine": name,
                "values": len(rows),
                "steps": steps,
                "largest_rel_diff": worst,
                "first_divergence": None
                if diverged is None
                else {
                    "step": diverged.step,
                    "value": diverged.name,
                    "rel_diff": diverged.errors[i - 1],
                },
                "final_parameters": {
                    "name": models.name,
                    "max_abs": models.max_abs,
                    "max_rel": models.max_rel,
                },
                "final_state": {
                    "name": state.name,
                    "max_abs": state.max_abs,
                    "max_rel": state.max_rel,
                    "missing": state.missing,
                    "rounding_noise": noisy,
                    "beyond_tolerance": unexplained,
                },
            }
        )
    print("PARITY FAILED" if failed else "PARITY OK")
    if options.json:
        _write_json(
            options.json,
            {
                "script": options.script,
                "args": list(options.args),
                "engines": options.engines,
                "reference": reference,
                "precision": run_precision,
                "atol": options.atol,
                "state_rtol": state_rtol,
                "ok": not failed,
                "rows": [
                    {
                        "step": r.step,
                        "value": r.name,
                        "rtol": rtols[(r.step, r.name)],
                        "values": [_json_value(v) for v in r.values],
                        "rel_diffs": list(r.errors),
                        "ok": r.ok,
                    }
                    for r in rows
                ],
                "engines_vs_reference": summaries,
            },
        )
    return 1 if failed else 0


def _noise(options, args, tmp, reference) -> dict:
    """How much each final-state tensor of the reference changes when its parameters move by
    one rounding step (relative, as ``compare_state`` measures); {} if that rerun failed."""
    base = record.load_run(os.path.join(tmp, f"{reference}.npz"))[1]
    result = _record(reference, options, args, tmp, perturb=True)
    if isinstance(result, int):
        print(
            f"  (the perturbed {reference} run failed: the state is judged by the tolerance alone)"
        )
        return {}
    return compare_state(base, result[1]).relative


def _print_noise(noisy, state, noise, names, reference) -> None:
    def owner(name):
        prefix = name.rsplit(".", 1)[0]
        return f" of {names[prefix]}" if prefix in names else ""

    worst = max(noisy, key=lambda n: state.relative[n])
    print(
        f"  rounding noise: {len(noisy)} tensor{'s' if len(noisy) > 1 else ''} beyond the "
        f"tolerance that {reference} itself does not reproduce: rerun with its parameters "
        f"moved by one rounding step, it changes them by {NOISE_DOMINATED:g} or more, or by at"
        f" least 1/{NOISE_FACTOR} of the difference here (largest: {worst}{owner(worst)}, "
        f"{state.relative[worst]:.2e} here, {noise.get(worst, 0.0):.2e} {reference} vs "
        f"{reference}): "
        + ", ".join(f"{n}{owner(n)}" for n in noisy[:6])
        + (" ..." if len(noisy) > 6 else "")
    )


def _json_value(v):
    if v is None:
        return None
    return (
        float(v.reshape(()))
        if v.size == 1
        else {"size": int(v.size), "max_abs": float(abs(v).max()) if v.size else 0.0}
    )


def _write_json(path: str, document: dict) -> None:
    """JSON has no inf or NaN: those are written as the strings "inf" and "nan"."""

    def clean(obj):
        if isinstance(obj, dict):
            return {k: clean(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [clean(v) for v in obj]
        if isinstance(obj, float) and not math.isfinite(obj):
            return str(obj)
        return obj

    with open(path, "w") as f:
        json.dump(clean(document), f, indent=1)


def _tolerance_line(
    options, run_precision: str, rtols: dict, state_rtol: float, precisions=()
) -> str:
    if options.rtol is not None:
        closure = f"rtol={options.rtol:g} (--rtol)"
    else:
        used = sorted(set(rtols.values())) or [RTOL_BY_PRECISION[run_precision]]
        closure = (
            "rtol by precision ("
            + ", ".join(f"{k} {v:g}" for k, v in RTOL_BY_PRECISION.items())
            + "): "
            + " / ".join(f"{v:g}" for v in used)
            + " here"
        )
    computed = "float32" if run_precision == "float32" else f"{run_precision} (mixed precision)"
    if len(set(precisions)) > 1:  # e.g. csx in its own mixed precision against eager float32
        computed += " on " + ", ".join(
            f"{name}" for name, p in zip(options.engines, precisions) if p == run_precision
        )
        computed += (
            ", "
            + ", ".join(
                f"{p} on {name}"
                for name, p in zip(options.engines, precisions)
                if p != run_precision
            )
            + " (compared at the coarser precision's tolerance)"
        )
    return (
        f"tolerances: this run computes in {computed}; closure values {closure}, "
        f"atol={options.atol:g}; final state {state_rtol:g}"
    )


_NOTED_WARNINGS = ("GradientAccumulationWarning", "RecompilationWarning", "FrozenValueWarning")


def _warnings(output: str) -> list:
    """The project's warnings that explain differences between engines, from a run's output."""
    found = []
    for line in output.splitlines():
        for category in _NOTED_WARNINGS:
            marker = f"{category}: "
            if marker in line:
                text = category + ": " + line.split(marker, 1)[1].strip()
                if text not in found:
                    found.append(text)
    return found


def _likely_causes(diverged, rows, random_ops, run_precision, warnings) -> list:
    """What usually explains a divergence, from what the runs recorded."""
    causes = []
    if any(w.startswith("GradientAccumulationWarning") for w in warnings):
        causes.append(
            "the step does not zero its gradients: eager torch accumulates them "
            "across steps, the compiled step cannot (see the warning above); call "
            "optimizer.zero_grad() in the step"
        )
    if random_ops:
        first_step = max(min((r.step for r in rows), default=1), 1)
        first = diverged is None or diverged.step <= first_step
        causes.append(
            f"the step uses random ops ({', '.join(random_ops)}): both engines are seeded "
            "alike, but eager torch and JAX draw different random numbers, so values differ "
            + ("from the first step" if first else "once they are used")
            + ". Compare with them off (dropout p=0 or model.eval()) to check the rest"
        )
    if run_precision != "float32":
        causes.append(
            f"{run_precision} rounding: kernels round differently on each engine; "
            "the tolerances above are those of that precision (--rtol to change)"
        )
    return causes


def _brief(value) -> str:
    if value is None:
        return "(not recorded)"
    return f"{float(value.reshape(())):.7g}" if value.size == 1 else f"{value.size} values"
