"""Host memory: giving freed memory back to the operating system, and how a CPU step's
working memory is laid out.

glibc keeps freed blocks smaller than its mmap threshold (adaptive, up to 32 MiB) in its heaps
for reuse, so freeing the torch copy of a model's state (``DeviceState`` releases it between
steps) may not lower the process's resident memory at all: the blocks stay mapped, and the
step's own allocations, made on other threads (other arenas), cannot reuse them.
``malloc_trim`` hands them back. It walks every heap, so it is called only after large frees
(releases follow a synchronisation, not every step) and once per program, between XLA's
compile of the step and its first run (``Program``). Other C libraries (musl, macOS) have no
such function: nothing is done there.

How a CPU step's own working memory is laid out is the setting ``cpu_step_memory``
(``config``), turned into XLA options by ``step_compiler_options``. XLA's CPU runtime
allocates a step's temporaries as one block per run and frees it after; glibc maps any block
over 32 MiB (the ceiling of its mmap threshold) afresh each time, so every run faults its whole
working set in again (~40 000 page faults and ~60 ms of kernel time per ``bench_engine``
transformer step). ``lean``, the default, schedules the step for memory, as the XLA of JAX
0.7 did (the XLA of JAX 0.10 and 0.12 schedules for concurrency by default): 12-14% less
working memory, and as many fewer faults, at the same speed on the benchmarks here.
``reuse`` asks XLA for heaps under glibc's ceiling (``xla_multiheap_size_constraint_per_heap``),
which malloc keeps for the next run, but in the arena of the thread that freed them, and XLA
runs steps on more than one thread: up to a copy per thread stays resident, so it is not the
default (``benchmarks/cpu_results.md``). XLA cannot serialize an executable with more than one
temp heap, so a ``reuse`` step is never written to the persistent compilation cache
(``cacheable``): JAX would warn on every compile that the write failed. ``pool`` is ``lean``
with the step's working memory kept between runs by the engine's own pool (``step_pool``:
one process-wide copy, not one per thread), for the price of keeping it mapped. ``auto``, the
default, is ``pool`` where it can run (Linux, glibc, the helper built by ``make``) for steps
whose kept blocks stay within ``AUTO_POOL_BYTES`` in all, and ``lean`` otherwise (a larger
step, another C library, or a helper that cannot install: nothing is raised).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import jax
import numpy as np

from jax_backend import config, step_pool
from jax_backend.errors import CstorchRuntimeError

# Under glibc's largest mmap threshold (32 MiB on 64-bit), with room for its chunk header and
# XLA's alignment: a heap this size is kept by malloc when freed, not unmapped.
STEP_HEAP_BYTES = 31 << 20

# cpu_step_memory's choices and their XLA options (module docstring). XLA's memory-optimized
# schedule is an enum option where it exists (JAX 0.10, 0.12); older XLA (JAX 0.7) has only the
# bool, which newer XLA still accepts as a compile option but ignores.
_MEMORY_SCHEDULE = ("xla_cpu_scheduler_type", "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED")
_MEMORY_SCHEDULE_BEFORE = ("xla_cpu_enable_concurrency_optimized_scheduler", False)
_HEAPS_OPTION = "xla_multiheap_size_constraint_per_heap"
STEP_MEMORY: dict[str, dict] = {
    "lean": dict([_MEMORY_SCHEDULE]),
    "xla": {},
    "reuse": {_HEAPS_OPTION: STEP_HEAP_BYTES},
    "pool": dict([_MEMORY_SCHEDULE]),  # and step_pool (pooled)
    "auto": dict([_MEMORY_SCHEDULE]),  # pool where it can run, else lean (the same program)
}

#: ``auto`` pools a step while the pool may keep at most this much between runs in all
#: (``step_pool.KEEP`` blocks of every pooled step's working memory): one step up to 512 MiB.
AUTO_POOL_BYTES = 1 << 30

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
    """XLA options for a step compiled for ``platform``: ``cpu_step_memory``'s on the CPU
    (``reuse`` only with glibc, whose heaps it relies on); none elsewhere."""
    if platform != "cpu":
        return {}
    choice = config.cpu_step_memory.value  # (one of STEP_MEMORY: checked where declared)
    if choice == "reuse" and _malloc_trim() is None:
        return {}
    if choice == "pool" and (why := pool_unavailable()) is not None:
        raise CstorchRuntimeError(f"cpu_step_memory='pool' cannot run here: {why}; use 'lean'")
    if choice in ("lean", "pool", "auto") and not _xla_has_option(*_MEMORY_SCHEDULE):
        return dict([_MEMORY_SCHEDULE_BEFORE])
    return dict(STEP_MEMORY[choice])


def pool_unavailable() -> str | None:
    """Why ``cpu_step_memory="pool"`` cannot run in this process (None: it can)."""
    if _malloc_trim() is None:  # not glibc, whose allocator the pool's helper calls
        return "it relies on glibc's allocator"
    return step_pool.unavailable()


def pooled(platform: str) -> bool:
    """Whether a step compiled now for ``platform`` may keep its working memory in the
    engine's pool (``cpu_step_memory`` ``pool``, or ``auto`` where the pool can run; CPU only):
    see ``keep_step_memory``."""
    if platform != "cpu":
        return False
    choice = config.cpu_step_memory.value
    return choice == "pool" or (choice == "auto" and pool_unavailable() is None)


def keep_step_memory(compiled, torch_kernels: bool = False) -> None:
    """Registers a compiled CPU step's working-memory size with the pool, which keeps such
    blocks between runs (``step_pool``), and, for a step that calls torch's CPU kernels
    (``torch_kernels``), the blocks those allocate (``step_pool.keep_torch_blocks``)."""
    analysis = compiled.memory_analysis()
    temp = int(getattr(analysis, "temp_size_in_bytes", 0) if analysis is not None else 0)
    auto = config.cpu_step_memory.value == "auto"
    try:
        step_pool.keep(temp, budget=AUTO_POOL_BYTES if auto else None)  # auto: over it, lean
        if torch_kernels:
            step_pool.keep_torch_blocks()
    except CstorchRuntimeError:
        if not auto:
            raise
        # auto: where the pool cannot install (another jaxlib or torch build), steps run as lean


def cacheable(options: dict) -> bool:
    """Whether a step compiled with ``options`` may go to JAX's persistent compilation cache.
    Not with XLA's per-heap limit: a step whose temporaries exceed it gets several temp heaps,
    and XLA's CPU executable then refuses to serialize ("Multiple temp buffer allocations")."""
    return _HEAPS_OPTION not in options


@functools.lru_cache(maxsize=None)
def _xla_has_option(name: str, value) -> bool:
    """Whether this jaxlib's XLA knows the compile option ``name`` (a trivial compile, once)."""
    try:
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            jax.jit(lambda x: x, compiler_options={name: value}).lower(np.float32(0)).compile()
    except Exception as error:  # XLA raises its own status type
        if "no such compile option" in str(error).lower():
            return False
        raise
    return True
