"""The JAX settings the engine's own work runs under, applied to that work only.

torch's int64 and float64 tensors need JAX's 64-bit types, which JAX turns off by default
(``jnp.ones(2)`` is float32). The engine never changes that default for the process: every
entry point that creates arrays, traces, compiles or runs a program does so inside
``engine_scope()`` (or is decorated with ``in_engine_scope``), a thread-local setting
that ends with the call. A JAX-native user's own programs keep float32 defaults while a
cstorch step in the same process keeps torch's dtypes.

The scope also sets the persistent-compilation-cache thresholds for the engine's programs
while the engine's cache is on (``compilation_cache``): every program is written, however
small or quick to compile, without changing the thresholds of the user's programs.

A scope undoes its setting on the way out, but a Ctrl-C that lands inside that way out (in the
Python code of a context manager's exit) can cut it short and leave the thread in 64-bit
mode; ``torch.no_grad()``'s exit, around the engine's writes into torch tensors, likewise
leaves grad mode off. So every scope, a step's call and a read of the state wrap their work
in ``thread_settings_kept()``, which puts both thread settings back as the work found them
whatever stopped it (one Ctrl-C is one interrupt: when it cut a scope's exit short, it is
already on its way out as the keeper puts the settings back).

Arrays made in the scope keep their dtypes outside it; what must be in it is JAX *making*
an array or a program from values (``device_put``, ``jnp.asarray``, tracing, a ``jit``
call, whose cache key includes the setting).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax
import torch

if hasattr(jax, "enable_x64"):  # JAX >= 0.8: a thread-local context manager

    def _x64():
        return jax.enable_x64(True)
else:  # JAX 0.6 and 0.7
    from jax.experimental import enable_x64 as _x64  # type: ignore[attr-defined, no-redef]

try:  # the cache thresholds as thread-local states; without them, JAX's defaults apply
    from jax._src import config as _jax_config

    _CACHE_THRESHOLDS: tuple = (
        (_jax_config.persistent_cache_min_compile_time_secs, 0.0),
        (_jax_config.persistent_cache_min_entry_size_bytes, -1),  # -1: no minimum
    )
except (ImportError, AttributeError):  # pragma: no cover - depends on the JAX version
    _CACHE_THRESHOLDS = ()

_cache_thresholds_on = False  # set by compilation_cache while the engine's cache is on

try:  # the thread-local state behind jax.enable_x64: what thread_settings_kept reads and resets
    _X64: Any = _jax_config.enable_x64
    _X64.get_local, _X64.set_local  # noqa: B018 - present since JAX 0.4.26
    _UNSET = _jax_config.config_ext.unset
except (NameError, AttributeError):  # pragma: no cover - depends on the JAX version
    _X64 = None


def set_cache_thresholds(on: bool) -> None:
    global _cache_thresholds_on
    _cache_thresholds_on = bool(on)


@contextlib.contextmanager
def engine_scope():
    """64-bit types (and, with the engine's cache on, its cache thresholds) for the block,
    on this thread only."""
    with thread_settings_kept(), _x64():
        if not (_cache_thresholds_on and _CACHE_THRESHOLDS):
            yield
            return
        with contextlib.ExitStack() as stack:
            for state, value in _CACHE_THRESHOLDS:
                stack.enter_context(state(value))
            yield


@contextlib.contextmanager
def no_cache_writes():
    """Programs compiled in the block are not written to JAX's persistent compilation cache
    (they may still be read from it), on this thread only; for executables XLA cannot
    serialize (``host_memory.cacheable``)."""
    if not _CACHE_THRESHOLDS:
        yield
        return
    min_compile_time, _ = _CACHE_THRESHOLDS[0]
    with min_compile_time(float("inf")):  # no compile takes that long: nothing is written
        yield


@contextlib.contextmanager
def thread_settings_kept():
    """This thread's JAX 64-bit setting and torch grad mode, after the block, as they were
    before it, even where an interrupt cut short the exit of an engine scope or of
    ``torch.no_grad()`` inside the block (see the module's text)."""
    grad = torch.is_grad_enabled()
    before = _X64.get_local() if _X64 is not None else None
    try:
        yield
    finally:
        if torch.is_grad_enabled() is not grad:
            torch._C._set_grad_enabled(grad)  # C: torch.set_grad_enabled's exit is Python
        if _X64 is not None and _X64.get_local() is not before:
            _X64.set_local(before)
            hook = getattr(_X64, "_update_thread_local_hook", None)
            if hook is not None:  # as JAX's own context manager does on its way out
                hook(None if before is _UNSET else before)


def in_engine_scope(function):
    """Decorates ``function`` to run inside ``engine_scope()``."""

    @functools.wraps(function)
    def scoped(*args, **kwargs):
        with engine_scope():
            return function(*args, **kwargs)

    return scoped
