"""The JAX engine: capture a torch step, lower it to JAX, run it as a jitted program.

This package knows nothing of the cstorch API. Its public surface:

* ``capture_step`` / ``Slot`` / ``CapturedStep``: torch step function -> functional ATen graph.
* ``Program``: a captured step compiled with ``jax.jit`` (donated state, async dispatch,
  jaxpr / StableHLO / cost-analysis introspection).
* ``DeviceState``: the JAX arrays holding torch state tensors between steps (``state``; the
  guard that keeps the torch objects current is ``state_guard``).
* ``LazyTensor`` / ``materialize``: torch tensors backed by not-yet-read JAX arrays.
* ``optimizers`` / ``schedules``: optax-style pure update rules and schedules.
* ``torch_ops``: torch custom ops (optimizer step, schedule) that lower to those functions.
* ``sparsity`` / ``sparse_ops``: weight-sparsity mask maths (top-k, drop/grow, balanced
  groups) as pure JAX functions, and the torch custom ops that lower to them.
* ``registry``: the ATen lowering table (``lowers``).
* ``mesh``: devices, the ``(csx, ws)`` data-parallel / sharded-state layout of a multi-device
  (and multi-process) program, global values of arrays, collectives counted in compiled HLO.
* ``precision``: full or mixed-precision (autocast at capture) policies.
* ``target``: what a step is lowered for (platform, float32 matmul precision, attention).
* ``compilation_cache``: JAX's persistent compilation cache for the engine's programs
  (``acquire``/``release``, see its docstring).
* ``step_pool``: a pool that keeps CPU steps' working memory between runs (the setting
  ``cpu_step_memory``, ``pool`` and the default ``auto``; its native helper is
  native/step_pool.c).
* ``ffi_libraries``: the engine's JAX FFI custom calls in C++ (native/*.cc: the layout copy,
  torch's convolution kernels), built per jaxlib (and torch) by ``tools/build_native.py``.
* ``graph_cache``: a persistent cache of captured steps, stored as authenticated data and
  keyed by what the capture depends on (its ``fingerprint``) (off unless
  ``CSTORCH_GRAPH_CACHE`` asks for it, see its docstring).
* ``regular_files``: opening a path for reading only if it is a regular file (no FIFO,
  device or directory), for every reader of untrusted files.
* ``atomic_files``: writing a file (or a directory) under a temporary name and publishing it
  in one rename (or without replacing an existing one), for every writer whose output others
  read (checkpoints, cache, export); temporary names and the removal of dead writers' ones.
* ``jax_settings``: the JAX settings (64-bit types) the engine's own work runs under.
* ``config``: every environment variable and process-wide setting of the engine.

Importing the package changes nothing outside it: JAX's config (64-bit types stay off for the
user's programs), the environment and torch are as the user left them. The map of the engine
is docs/ARCHITECTURE.md.
"""

from jax_backend import (  # sparsity mask ops
    compilation_cache,
    config,
    dtypes,
    graph_cache,
    jax_settings,
    mesh,
    ops as ops,  # registers every ATen lowering
    optax_ops as optax_ops,  # cstorch::optax_update
    optimizers,
    precision,
    registry,
    schedules,
    sparse_ops,
    sparsity,
    step_pool,
    target,
    torch_ops,  # registers the cstorch:: custom ops
)
from jax_backend.capture import CapturedStep, Slot, capture_step
from jax_backend.errors import (
    CaptureError,
    JaxBackendError,
    LoweringError,
    LoweringNotFoundError,
    RecompilationError,
    ValueReadInTraceError,
)
from jax_backend.interpreter import GraphInterpreter
from jax_backend.lazy import LazyTensor, materialize
from jax_backend.precision import Policy
from jax_backend.program import Program
from jax_backend.state import DeviceState
from jax_backend.user_frames import register_internal_dir

__all__ = [
    "CaptureError",
    "CapturedStep",
    "DeviceState",
    "GraphInterpreter",
    "JaxBackendError",
    "LazyTensor",
    "LoweringError",
    "LoweringNotFoundError",
    "Policy",
    "Program",
    "RecompilationError",
    "Slot",
    "ValueReadInTraceError",
    "capture_step",
    "compilation_cache",
    "config",
    "dtypes",
    "graph_cache",
    "jax_settings",
    "materialize",
    "mesh",
    "optimizers",
    "precision",
    "register_internal_dir",
    "registry",
    "schedules",
    "sparse_ops",
    "sparsity",
    "step_pool",
    "target",
    "torch_ops",
]
