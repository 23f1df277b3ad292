"""Giving freed host memory back to the operating system.

glibc keeps freed blocks smaller than its mmap threshold (adaptive, up to 32 MiB) in its heaps
for reuse, so freeing the torch copy of a model's state (``DeviceState`` releases it between
steps) may not lower the process's resident memory at all: the blocks stay mapped, and the
step's own allocations, made on other threads (other arenas), cannot reuse them.
``malloc_trim`` hands them back. It walks every heap, so it is called only after large frees
(releases follow a synchronisation, not every step) and once per program, between XLA's
compile of the step and its first run (``Program``). Other C libraries (musl, macOS) have no
such function: nothing is done there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

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
