"""Giving freed host memory back to the operating system.

glibc keeps freed blocks smaller than its mmap threshold (adaptive, up to 32 MiB) in its heaps
for reuse, so freeing the torch copy of a model's state (``DeviceState`` releases it between
steps) may not lower the process's resident memory at all: the blocks stay mapped, and the
step's own allocations, made on other threads (other arenas), cannot reuse them.
``malloc_trim`` hands them back. It walks every heap, so it is called only after large frees
(releases follow a synchronisation, not every step) and once per program, between XLA's
compile of the step and its first run (``Program``). Other C libraries (musl, macOS) have no
such function: nothing is done there.

The other way round, ``step_compiler_options``: XLA's CPU runtime allocates a step's
temporaries as one block per run (146 MiB on ``bench_engine``'s transformer) and frees it
after. glibc maps any block over 32 MiB (the ceiling of its mmap threshold) afresh each time,
so every run faults its whole working set in again: ~40 000 page faults and ~60 ms of kernel
time per transformer step. Asking XLA for heaps under that ceiling
(``xla_multiheap_size_constraint_per_heap``) lets glibc keep them for the next run, but in
the heap of the thread that freed them, and XLA runs steps on more than one thread: up to a
copy per thread stays resident. So it is a setting, off by default (``config``,
``reuse_cpu_step_memory``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

from jax_backend import config

# Under glibc's largest mmap threshold (32 MiB on 64-bit), with room for its chunk header and
# XLA's alignment: a heap this size is kept by malloc when freed, not unmapped.
STEP_HEAP_BYTES = 31 << 20

# A trim takes ~10-60 ms on a GPT-2-small run; smaller frees are not worth it.
TRIM_MIN_BYTES = 16 << 20


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def freed(nbytes: int) -> None:
    """Tells that ``nbytes`` of host memory were just freed; returns them to the system when
    that is worth it (see the module docstring)."""
    if nbytes >= TRIM_MIN_BYTES:
        trim()


def trim() -> None:
    """Returns the C heap's free memory to the system now (after XLA compiles a step, whose
    working memory is freed by then but would stay resident through the first run)."""
    malloc_trim = _malloc_trim()
    if malloc_trim is not None:
        malloc_trim(0)


def step_compiler_options(platform: str) -> dict:
    """XLA options for a step compiled for ``platform``: on the CPU with glibc and
    ``reuse_cpu_step_memory`` on, temporaries in heaps malloc keeps between runs (module
    docstring); else none."""
    if platform != "cpu" or not config.reuse_cpu_step_memory.value or _malloc_trim() is None:
        return {}
    return {"xla_multiheap_size_constraint_per_heap": STEP_HEAP_BYTES}
