"""A pool for the working memory of the engine's CPU steps (``cpu_step_memory="pool"``).

XLA's CPU runtime allocates a step's temporaries as one block per run and frees it after the
run; glibc maps a block over 32 MiB afresh each time, so every run zero-fills and faults its
whole working set in again (``host_memory``; ``benchmarks/cpu_results.md``, "Page faults").
The pool keeps those blocks: a small C library (``native/step_pool.c``, built by ``make``)
points the ``posix_memalign`` and ``free`` calls of jaxlib's ``libjax_common.so`` (its GOT
entries) at itself, caches a freed block whose size a compiled step registered (its
``temp_size_in_bytes``) and hands it to the next request of that size. Every other allocation
goes straight through. At most ``KEEP`` blocks per size are kept: XLA may start a step's next
run on another thread before the last run has freed its block, so two are in use at times.

What it changes: none of the step's numbers (where the temporaries live, not what they hold);
the process keeps up to ``KEEP`` working-memory blocks per registered size mapped between
steps, one more than glibc would leave resident at the peak (a pooled block is resident when a
run takes it; a fresh mapping fills as the run goes), and a program no longer run keeps its
blocks until the backend is shut down. ``cpu_step_memory="auto"`` (the default) uses it for
steps whose blocks fit ``host_memory.AUTO_POOL_BYTES``; ``release`` (a backend's shutdown)
frees the kept blocks and puts the libraries' allocator calls back as they were.

A step that calls torch's CPU kernels (``ops/torch_kernels.py``: the convolutions) has a second
kind of working memory: the outputs and oneDNN buffers those kernels allocate through torch's
``libc10.so``, a few MiB each, sizes that repeat every run, which glibc hands back to the
system as its heaps shrink and faults in again (on ``bench_engine``'s CNN, ~8 000 of a step's
page faults), as are the buffers jaxlib allocates around those calls. ``keep_torch_blocks``
pools them too: for those two libraries, any block of at least ``TORCH_BLOCK_BYTES`` is cached
by its exact size, ``KEEP`` per size and ``TORCH_BLOCKS_BUDGET`` in all. Every allocation
torch and jaxlib make in the process passes the same hooks then, eager torch's and the user's
own JAX's too: smaller blocks go straight through (a size check, no lock). Steps without
torch's kernels do not install it (on ``bench_engine``'s transformer it gained nothing).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading

from jax_backend.errors import CstorchRuntimeError

#: The native helper, built from native/step_pool.c by ``make`` (the venv's set-up).
NATIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "_step_pool.so")
#: The jaxlib library whose allocations hold XLA's CPU temporaries (jaxlib 0.7 to 0.12).
XLA_LIBRARY = "libjax_common.so"
#: torch's library, whose allocations hold the results and buffers of its CPU kernels.
TORCH_LIBRARY = "libc10.so"
#: Blocks kept per registered size (see the module docstring).
KEEP = 2
#: torch's blocks: pooled from this size, at most this much kept in all.
TORCH_BLOCK_BYTES = 1 << 20
TORCH_BLOCKS_BUDGET = 256 << 20

_lock = threading.Lock()
_installed: set = set()  # the libraries patched since the last release
_sizes: set = set()  # the sizes registered since the install


@functools.lru_cache(maxsize=1)
def _native():
    library = ctypes.CDLL(NATIVE)
    library.pool_install.argtypes = [ctypes.c_char_p]
    library.pool_keep_range.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t]
    library.pool_keep_range.argtypes += [ctypes.c_int]
    library.pool_register.argtypes = [ctypes.c_size_t, ctypes.c_int]
    library.pool_stats.argtypes = [ctypes.c_long * 4]
    return library


def unavailable() -> str | None:
    """Why the pool cannot run in this process (None: it can), glibc aside: that is
    ``host_memory``'s check, ``pool_unavailable``."""
    if not sys.platform.startswith("linux"):
        return "it patches an ELF library's allocator calls: Linux only"
    if not os.path.exists(NATIVE):
        return f"its native helper {NATIVE} is not built (run `make native`: a C compiler)"
    return None


def keep(temp_bytes: int, budget: int | None = None) -> None:
    """Keeps freed working-memory blocks of ``temp_bytes`` (a compiled CPU step's temp size)
    for the next run, installing the pool on first use; with a ``budget``, only while the
    blocks it may keep (``kept_bytes``, this size included) stay within it. Raises
    ``CstorchRuntimeError`` (a ``RuntimeError``) naming why where it cannot run."""
    if temp_bytes <= 0:
        return
    library = _native()  # (host_memory checked unavailable() when the program was built)
    with _lock:
        if budget is not None and KEEP * sum(_sizes | {temp_bytes}) > budget:
            return  # over the budget: this step runs unpooled
        _install(XLA_LIBRARY, "jaxlib's", library.pool_install(XLA_LIBRARY.encode()))
        if library.pool_register(temp_bytes, KEEP) != 0:
            return  # a table of sizes full (16 distinct steps): this one runs unpooled
        _sizes.add(temp_bytes)


def keep_torch_blocks() -> None:
    """Keeps the blocks torch's CPU kernels, and jaxlib around them, allocate in a step
    (module docstring), installing the pool for both libraries on first use. Raises
    ``CstorchRuntimeError`` naming why where it cannot run."""
    library = _native()
    with _lock:
        for name, owner in ((TORCH_LIBRARY, "torch's"), (XLA_LIBRARY, "jaxlib's")):
            patched = library.pool_keep_range(
                name.encode(), TORCH_BLOCK_BYTES, TORCH_BLOCKS_BUDGET, KEEP
            )
            _install(name, owner, patched)


def _install(name: str, owner: str, patched: int) -> None:
    """Records library ``name`` as patched, or raises what the native install's count
    ``patched`` says (0: no entries, -1: not loaded, -2: too many libraries). With the lock."""
    if patched <= 0:
        why = {-1: "is not loaded", -2: "is one library too many for the pool"}.get(
            patched, "makes no posix_memalign/free calls"
        )
        raise CstorchRuntimeError(
            f"cpu_step_memory='pool' cannot run here: {owner} {name} {why}; use 'lean'"
        )
    _installed.add(name)


def kept_bytes() -> int:
    """The most memory the pool may keep between runs: ``KEEP`` blocks of every registered
    size, and torch's blocks' budget where they are pooled."""
    with _lock:
        torch_blocks = TORCH_BLOCKS_BUDGET if TORCH_LIBRARY in _installed else 0
        return KEEP * sum(_sizes) + torch_blocks


def stats() -> dict:
    """Counts since the pool was installed: requests served from the pool (``hits``) and by
    the allocator (``misses``), blocks given back (``released``) and kept now (``cached``)."""
    if not _installed:
        return {"hits": 0, "misses": 0, "released": 0, "cached": 0}
    out = (ctypes.c_long * 4)()
    _native().pool_stats(out)
    return dict(zip(("hits", "misses", "released", "cached"), out))


def installed(library: str = XLA_LIBRARY) -> bool:
    """Whether the pool has patched ``library`` (jaxlib's, by default)."""
    return library in _installed


def release() -> None:
    """Frees the kept blocks and restores the patched libraries' allocator calls (nothing if
    not installed). Blocks in use are freed by their runs as usual."""
    with _lock:
        if _installed:
            _native().pool_uninstall()
            _installed.clear()
        _sizes.clear()
