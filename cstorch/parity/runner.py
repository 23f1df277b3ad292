"""The ``python -m cstorch.parity`` command: run each engine in a subprocess, compare, report."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from cstorch import config
from cstorch.parity import record
from cstorch.parity.compare import compare_closures, compare_state, first_divergence, table

# name -> (engine, platform) of cstorch.parity.record
ENGINES = {"eager": ("eager", "cpu"), "jax-cpu": ("jax", "cpu"), "jax-gpu": ("jax", "gpu")}


def available_engines() -> list:
    """eager and JAX on CPU; JAX on GPU too when JAX sees a GPU."""
    from jax_backend import mesh

    return ["eager", "jax-cpu"] + (["jax-gpu"] if mesh.devices("gpu") else [])


def run_engine(name: str, script: str, args, out: str, seed: int = 0, verbose: bool = False,
               timeout: float | None = None) -> subprocess.CompletedProcess:
    """Runs ``script args`` on one engine in a fresh Python process, recording into ``out``."""
    engine, platform = ENGINES[name]
    command = [sys.executable, "-m", "cstorch.parity.record", "--engine", engine,
               "--platform", platform, "--seed", str(seed), "--out", out, script, *args]
    env = dict(config.launched_process_environment(os.environ), CSTORCH_ENGINE=engine)
    if verbose:
        return subprocess.run(command, env=env, timeout=timeout)
    return subprocess.run(command, env=env, timeout=timeout, capture_output=True, text=True)


def _parse(argv):
    parser = argparse.ArgumentParser(
        prog="python -m cstorch.parity",
        description="Run a cstorch script on several engines and compare every value passed "
                    "to its step closures and its final state.")
    parser.add_argument("--engines", default=None,
                        help=f"comma-separated, the first is the reference; of "
                             f"{', '.join(ENGINES)} (default: eager,jax-cpu, plus jax-gpu "
                             "when JAX sees a GPU)")
    parser.add_argument("--rtol", type=float, default=1e-4,
                        help="relative tolerance per closure value (default 1e-4)")
    parser.add_argument("--atol", type=float, default=1e-6,
                        help="absolute tolerance per closure value (default 1e-6)")
    parser.add_argument("--state-rtol", type=float, default=1e-3,
                        help="tolerance of the final state: max|a-b| / max|a| per tensor "
                             "(default 1e-3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of random, numpy and torch")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per engine")
    parser.add_argument("--verbose", action="store_true", help="show the script's own output")
    parser.add_argument("script", help="the cstorch training script, run unchanged")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    options = parser.parse_args(argv)
    if not os.path.isfile(options.script):
        parser.error(f"no such script: {options.script}")
    engines = available_engines() if options.engines is None else [
        e.strip() for e in options.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or len(engines) < 2:
        parser.error(f"--engines needs two or more of {', '.join(ENGINES)}; got "
                     f"{options.engines!r}")
    options.engines = engines
    return options


def main(argv=None) -> int:
    options = _parse(argv)
    runs, states = [], []
    with tempfile.TemporaryDirectory(prefix="cstorch-parity-") as tmp:
        for name in options.engines:
            out = os.path.join(tmp, f"{name}.npz")
            print(f"running {options.script} on {name} ...", flush=True)
            try:
                result = run_engine(name, options.script, options.args, out, options.seed,
                                    options.verbose, options.timeout)
            except subprocess.TimeoutExpired:
                print(f"error: the {name} run took longer than {options.timeout} s",
                      file=sys.stderr)
                return 2
            if result.returncode != 0 or not os.path.exists(out):
                tail = "" if options.verbose else (result.stdout + result.stderr)[-4000:]
                print(f"error: the {name} run failed (exit status {result.returncode}):\n"
                      f"{tail}", file=sys.stderr)
                return 2
            closures, state = record.load(out)
            runs.append(closures)
            states.append(state)

    rows = compare_closures(runs, options.rtol, options.atol)
    print()
    print(table(rows, options.engines))
    print()
    failed = False
    reference = options.engines[0]
    steps = len({row.step for row in rows})
    if not rows:
        print("warning: the script passed no values to step closures; only the final state "
              "is compared")
    for i, name in enumerate(options.engines[1:], start=1):
        worst = max((row.errors[i - 1] for row in rows), default=0.0)
        print(f"{name} vs {reference}: {len(rows)} values over {steps} steps, largest "
              f"relative difference {worst:.2e} (tolerance rtol={options.rtol:g}, "
              f"atol={options.atol:g})")
        diverged = first_divergence(rows, i)
        if diverged is not None:
            failed = True
            print(f"  FIRST DIVERGENCE at step {diverged.step}: {diverged.name} = "
                  f"{_brief(diverged.values[i])} on {name}, {_brief(diverged.values[0])} on "
                  f"{reference} (relative difference {diverged.errors[i - 1]:.2e})")
        models = compare_state(*({k: v for k, v in s.items() if k.startswith("model")}
                                 for s in (states[0], states[i])))
        print(f"  final parameters: largest difference in {models.name or '-'}: max|diff| "
              f"{models.max_abs:.3e}, relative {models.max_rel:.3e}")
        state = compare_state(states[0], states[i])
        print(f"  final state (models and optimizers, {len(states[0])} tensors): largest "
              f"difference in {state.name or '-'}: max|diff| {state.max_abs:.3e}, relative "
              f"{state.max_rel:.3e} (tolerance {options.state_rtol:g})")
        if state.missing:
            print(f"  state recorded by one engine only (or with different shapes): "
                  f"{', '.join(state.missing[:5])}{' ...' if len(state.missing) > 5 else ''}")
        if state.max_rel > options.state_rtol:
            failed = True
    print("PARITY FAILED" if failed else "PARITY OK")
    return 1 if failed else 0


def _brief(value) -> str:
    if value is None:
        return "(not recorded)"
    return f"{float(value.reshape(())):.7g}" if value.size == 1 else f"{value.size} values"
