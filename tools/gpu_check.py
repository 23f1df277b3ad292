"""The GPU check, one command: ``python tools/gpu_check.py --out DIR`` (``make gpu-check``).

Runs the project from this source tree (``PYTHONPATH``; nothing is installed) and needs only
what a GPU machine's Python has: torch, JAX, optax, flax, h5py (``hdf5plugin`` and ``pydantic``
are optional). It

1. records the platform (Python, torch, JAX, the devices each sees);
2. runs the parity tool (``python -m cstorch.parity``) on ``examples/mnist_mlp.py`` and on
   ``examples/gpt_adamw.py`` in float32 and bfloat16: eager torch (the reference, on the CPU)
   against the JAX program on the GPU (``jax-gpu``), or on the CPU (``jax-cpu``) when JAX sees
   no GPU, which it says; each prints its per-step table;
3. runs ``benchmarks/bench_gpu.py --json DIR/bench_gpu.json`` when that file exists and JAX
   sees a GPU (or when ``--bench`` names a script), and keeps its JSON;
4. writes everything to ``DIR/gpu_check.json``; exits 1 if a parity case failed or a run
   broke, else 0.

``--quick`` uses a few steps of tiny models, so the whole check runs on a CPU in a few minutes
(the test suite runs it that way); ``--cases gpt_adamw_bf16`` runs only the cases named.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks", "bench_gpu.py")


def cases(quick: bool, artifacts: str) -> list:
    mnist = (
        ["--steps", "5", "--log-every", "1"] if quick else ["--steps", "100", "--log-every", "10"]
    )
    gpt = (
        [
            "--steps",
            "3",
            "--layers",
            "1",
            "--d-model",
            "32",
            "--seq-len",
            "16",
            "--batch-size",
            "4",
            "--log-every",
            "1",
        ]
        if quick
        else ["--steps", "20", "--log-every", "2"]
    )
    examples = os.path.join(ROOT, "examples")
    return [
        (
            "mnist_mlp",
            os.path.join(examples, "mnist_mlp.py"),
            mnist + ["--artifact-dir", os.path.join(artifacts, "mnist")],
        ),
        (
            "gpt_adamw_fp32",
            os.path.join(examples, "gpt_adamw.py"),
            gpt + ["--precision", "float32", "--artifact-dir", os.path.join(artifacts, "gpt32")],
        ),
        (
            "gpt_adamw_bf16",
            os.path.join(examples, "gpt_adamw.py"),
            gpt + ["--precision", "bfloat16", "--artifact-dir", os.path.join(artifacts, "gpt16")],
        ),
    ]


CASE_NAMES = tuple(name for name, _, _ in cases(True, ""))


def source_tree_env() -> dict:
    """This process's environment with the source tree first on ``PYTHONPATH``."""
    env = dict(os.environ)
    paths = [ROOT, os.path.join(ROOT, "compat")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Each engine and the benchmark run in their own process: none may take the GPU's memory
    # for the next one while this one waits.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


_PLATFORM = r"""
import json, platform, sys
info = {"python": platform.python_version()}
try:
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.cuda.is_available()
    if info["torch_cuda"]:
        info["torch_device"] = torch.cuda.get_device_name(0)
except Exception as e:
    info["torch_error"] = f"{type(e).__name__}: {e}"
try:
    import jax
    info["jax"] = jax.__version__
    info["jax_backend"] = jax.default_backend()
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    info["jax_gpus"] = [str(getattr(d, "device_kind", d)) for d in gpus]
except Exception as e:
    info["jax_error"] = f"{type(e).__name__}: {e}"
for name in ("optax", "flax", "h5py", "hdf5plugin", "pydantic"):
    try:
        info[name] = __import__(name).__version__
    except Exception:
        info[name] = None
print(json.dumps(info))
"""


def platform_info(env: dict) -> dict:
    """What this machine offers, read in a child process (so this one never holds a GPU)."""
    out = subprocess.run(
        [sys.executable, "-c", _PLATFORM], env=env, capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        return {"error": (out.stdout + out.stderr)[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _tail(text: str, limit: int = 4000) -> str:
    return text[-limit:] if text else ""


def run_parity(name, script, args, engines, out_dir, env, timeout) -> dict:
    """One parity run, with the tool's tolerances by precision (its JSON has them)."""
    report_path = os.path.join(out_dir, f"parity_{name}.json")
    command = [
        sys.executable,
        "-m",
        "cstorch.parity",
        "--engines",
        ",".join(engines),
        "--json",
        report_path,
        script,
        *args,
    ]
    print(f"\n=== parity: {name} ({' vs '.join(engines)}) ===", flush=True)
    start = time.monotonic()
    try:
        out = subprocess.run(
            command, env=env, cwd=out_dir, capture_output=True, text=True, timeout=timeout
        )
        returncode, stdout, stderr = out.returncode, out.stdout, out.stderr
    except subprocess.TimeoutExpired as expired:
        returncode, stdout = None, expired.stdout or ""
        stderr = f"timed out after {timeout} s"
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
    seconds = round(time.monotonic() - start, 1)
    print(stdout, end="", flush=True)
    if returncode not in (0, 1):
        print(_tail(stderr), file=sys.stderr, flush=True)
    result = {
        "case": name,
        "engines": engines,
        "command": [
            os.path.relpath(c, ROOT) if os.path.isabs(c) and c.startswith(ROOT) else c
            for c in command
        ],
        "returncode": returncode,
        "seconds": seconds,
        "verdict": {0: "ok", 1: "failed"}.get(returncode, "error"),
    }
    if os.path.exists(report_path):
        with open(report_path) as f:
            result["report"] = json.load(f)
    if result["verdict"] == "error":
        result["stderr_tail"] = _tail(stderr)
    return result


def run_bench(bench: str, out_dir: str, env, extra: list, timeout) -> dict:
    json_path = os.path.join(out_dir, "bench_gpu.json")
    command = [sys.executable, bench, "--json", json_path, *extra]
    print(f"\n=== benchmark: {os.path.relpath(bench, ROOT)} ===", flush=True)
    start = time.monotonic()
    try:
        out = subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
        returncode, stdout, stderr = out.returncode, out.stdout, out.stderr
    except subprocess.TimeoutExpired:
        returncode, stdout, stderr = None, "", f"timed out after {timeout} s"
    print(stdout, end="", flush=True)
    result = {
        "command": command[1:],
        "returncode": returncode,
        "seconds": round(time.monotonic() - start, 1),
    }
    if returncode != 0:
        result["stderr_tail"] = _tail(stderr)
        print(_tail(stderr), file=sys.stderr, flush=True)
    if os.path.exists(json_path):
        with open(json_path) as f:
            result["results"] = json.load(f)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/gpu_check.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, help="directory for the JSON results")
    parser.add_argument(
        "--quick", action="store_true", help="a few steps of tiny models (minutes on a CPU)"
    )
    parser.add_argument(
        "--bench",
        default=None,
        metavar="SCRIPT",
        help="run this benchmark even without a GPU (default: "
        "benchmarks/bench_gpu.py, when it exists and JAX sees a GPU)",
    )
    parser.add_argument(
        "--cases",
        default=None,
        metavar="NAME[,NAME...]",
        help="run only these parity cases (default: all: " + ", ".join(CASE_NAMES) + ")",
    )
    parser.add_argument("--bench-args", default="", help="more arguments for the benchmark")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmark")
    parser.add_argument(
        "--timeout",
        type=float,
        default=1200,
        help="seconds per parity case or benchmark run (default 1200)",
    )
    options = parser.parse_args(argv)
    chosen = options.cases.split(",") if options.cases else list(CASE_NAMES)
    unknown = [name for name in chosen if name not in CASE_NAMES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; the cases: {', '.join(CASE_NAMES)}")

    out_dir = os.path.abspath(options.out)
    os.makedirs(out_dir, exist_ok=True)
    env = source_tree_env()
    start = time.monotonic()
    info = platform_info(env)
    print("platform: " + json.dumps(info), flush=True)
    has_gpu = bool(info.get("jax_gpus"))
    engines = ["eager", "jax-gpu" if has_gpu else "jax-cpu"]
    document = {
        "platform": info,
        "quick": options.quick,
        "engines": engines,
        "note": None,
        "parity": [],
        "bench": None,
    }
    if not has_gpu:
        document["note"] = (
            "JAX sees no GPU here: the JAX engine ran on the CPU (jax-cpu), so "
            "these results say nothing about the GPU path."
        )
        print("NOTE: " + document["note"], flush=True)

    artifacts = os.path.join(out_dir, "artifacts")
    for name, script, args in cases(options.quick, artifacts):
        if name not in chosen:
            continue
        document["parity"].append(
            run_parity(name, script, args, engines, out_dir, env, options.timeout)
        )

    bench = options.bench or BENCH
    if options.no_bench:
        document["bench"] = {"skipped": "--no-bench"}
    elif not os.path.exists(bench):
        document["bench"] = {"skipped": f"{os.path.relpath(bench, ROOT)} does not exist"}
    elif not has_gpu and options.bench is None:
        document["bench"] = {
            "skipped": "JAX sees no GPU (name the script with --bench to run it anyway)"
        }
    else:
        document["bench"] = run_bench(
            bench, out_dir, env, shlex.split(options.bench_args), options.timeout
        )
    document["seconds"] = round(time.monotonic() - start, 1)

    failed = [p["case"] for p in document["parity"] if p["verdict"] != "ok"]
    bench_broke = "returncode" in document["bench"] and document["bench"]["returncode"] != 0
    document["ok"] = not failed and not bench_broke
    path = os.path.join(out_dir, "gpu_check.json")
    with open(path, "w") as f:
        json.dump(document, f, indent=1)

    print("\n=== summary ===")
    for p in document["parity"]:
        worst = (p.get("report") or {}).get("engines_vs_reference") or [{}]
        print(
            f"{p['case']:<16} {p['verdict']:<7} largest per-step relative difference "
            f"{worst[0].get('largest_rel_diff', '-')!s:<24} ({p['seconds']} s)"
        )
    bench_line = document["bench"].get("skipped") or (
        f"exit status {document['bench']['returncode']} ({document['bench']['seconds']} s)"
    )
    print(f"benchmark: {bench_line}")
    if document["note"]:
        print("NOTE: " + document["note"])
    print(f"results: {path} ({document['seconds']} s)")
    return 0 if document["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
