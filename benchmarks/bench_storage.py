"""Checkpoint save/load speed and memory: cstorch.save/load versus torch.save/load.

    python benchmarks/bench_storage.py               # 1 GiB: 16 float32 tensors of 64 MiB
    python benchmarks/bench_storage.py --size-mib 64 # quick smoke run

Every measurement runs in a fresh subprocess so that its peak RSS (``resource.getrusage``'s
``ru_maxrss``, a high-water mark) belongs to that operation alone:

* save: build the state dict (random float32), then save it. "extra" is the peak RSS minus the
  RSS right after building the state dict, i.e. the memory the save itself needed.
* load: load the file and materialize every tensor, keeping all of them in memory (cstorch with
  ``map_location="cache"`` and one read of each tensor; torch.load is eager anyway). "extra" is
  the peak RSS minus the interpreter's RSS before loading, minus the data size.

Files are written to a temporary directory and deleted at the end; loads follow their saves,
so both libraries read from the page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_mib() -> float:
    """Current RSS (from /proc), falling back to the peak where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _state_dict(size_mib: int, tensors: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    per_tensor = size_mib * 2**20 // 4 // tensors
    cols = 1024
    rows = max(1, per_tensor // cols)
    return {
        f"layer{i}.weight": torch.randn(rows, cols, generator=generator) for i in range(tensors)
    }


def worker(op: str, impl: str, path: str, size_mib: int, tensors: int) -> dict:
    import torch

    sys.path.insert(0, REPO)
    import cstorch.storage as storage

    if op == "save":
        state = _state_dict(size_mib, tensors)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        baseline = _rss_mib()
        start = time.perf_counter()
        if impl == "cstorch":
            storage.save(state, path)
        else:
            torch.save(state, path)
        seconds = time.perf_counter() - start
        extra = _peak_mib() - baseline
    else:
        warmup = 0.0
        if impl == "cstorch":
            # The first op on any torch.Tensor subclass with __torch_dispatch__ makes torch 2.13
            # import sympy & co (~1 s, once per process; a process that traced a step has paid
            # it already). Timed separately so the table shows the checkpoint cost.
            from cstorch.storage.serializers import DeferredFullTensor

            start = time.perf_counter()
            DeferredFullTensor((1,), torch.float32, 0.0).sum()
            warmup = time.perf_counter() - start
        baseline = _rss_mib()
        start = time.perf_counter()
        if impl == "cstorch":
            state = storage.load(path, map_location="cache")
        else:
            state = torch.load(path)
        checksum = 0.0
        for tensor in state.values():  # materialize (and keep) every tensor
            checksum += float(tensor.view(-1)[0])
        seconds = time.perf_counter() - start
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        extra = _peak_mib() - baseline - nbytes / 2**20
        return {
            "op": op,
            "impl": impl,
            "seconds": seconds,
            "gib_s": nbytes / 2**30 / seconds,
            "peak_mib": _peak_mib(),
            "extra_mib": extra,
            "warmup_s": warmup,
            "file_mib": os.path.getsize(path) / 2**20,
        }
    return {
        "op": op,
        "impl": impl,
        "seconds": seconds,
        "gib_s": nbytes / 2**30 / seconds,
        "peak_mib": _peak_mib(),
        "extra_mib": extra,
        "file_mib": os.path.getsize(path) / 2**20,
    }


def run(size_mib: int, tensors: int, directory: str | None) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        for impl, name in (("cstorch", "ckpt.mdl"), ("torch", "ckpt.pt")):
            path = os.path.join(tmp, name)
            for op in ("save", "load"):
                command = [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--worker",
                    op,
                    impl,
                    path,
                    "--size-mib",
                    str(size_mib),
                    "--tensors",
                    str(tensors),
                ]
                out = subprocess.run(command, check=True, capture_output=True, text=True)
                results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return results


def print_table(results: list[dict], size_mib: int, tensors: int) -> None:
    print(f"state dict: {tensors} float32 tensors, {size_mib} MiB in total")
    print(
        f"{'op':<5} {'impl':<8} {'seconds':>8} {'GiB/s':>7} {'peak RSS MiB':>13} "
        f"{'extra MiB':>10} {'file MiB':>9}"
    )
    for r in results:
        print(
            f"{r['op']:<5} {r['impl']:<8} {r['seconds']:>8.3f} {r['gib_s']:>7.2f} "
            f"{r['peak_mib']:>13.0f} {r['extra_mib']:>10.0f} {r['file_mib']:>9.0f}"
        )
    for r in results:
        if r.get("warmup_s"):
            print(
                f"(+ {r['warmup_s']:.2f} s once per process before the first cstorch {r['op']}: "
                "torch's tensor-subclass dispatch warm-up, not included above)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="total state-dict size")
    parser.add_argument("--tensors", type=int, default=16, help="number of tensors")
    parser.add_argument("--dir", default=None, help="where to write the files (default: $TMPDIR)")
    parser.add_argument("--worker", nargs=3, metavar=("OP", "IMPL", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        op, impl, path = args.worker
        print(json.dumps(worker(op, impl, path, args.size_mib, args.tensors)))
        return
    print_table(run(args.size_mib, args.tensors, args.dir), args.size_mib, args.tensors)


if __name__ == "__main__":
    main()
