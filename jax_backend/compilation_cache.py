"""JAX's persistent compilation cache for the engine's programs, so a second run skips XLA.

The cache is JAX's own: an entry is keyed by the lowered module, the compile options, the
device kind and the jax/jaxlib versions, so a changed step, model, input shape or version
misses and compiles afresh; a stale program can never be used. Entries are plain files and
the directory is safe to delete at any time.

Importing the engine changes nothing. ``acquire()`` (cstorch calls it when a backend is
created) turns the cache on and ``release()`` (when the backend is torn down) puts JAX back
as it was. Where it lives, in order:

* a directory the user gave JAX (``jax_compilation_cache_dir``): it is used as it is;
* ``CSTORCH_COMPILATION_CACHE``: a directory, or ``off`` (also ``0``, ``false``, empty);
* ``$XDG_CACHE_HOME/cstorch-jax/xla`` (``~/.cache/cstorch-jax/xla``).

JAX has one cache directory per process, not one per program: while a backend is held and
the user has not chosen a directory, ``jax_compilation_cache_dir`` names ours, so the user's
own ``jax.jit`` programs that pass JAX's default thresholds (a second of compile time) are
cached there too. The engine's thresholds (cache every program) are thread-local and apply
to its own programs only (``jax_settings.engine_scope``).
"""

from __future__ import annotations

import os

import jax

from jax_backend import config, jax_settings

ENV_VAR = config.compilation_cache.env_var

_holders = 0
_ours: str | None = None  # the directory acquire() gave JAX (restored on the last release)


def default_directory() -> str | None:
    """The cache directory the settings ask for, or None when it is switched off."""
    return config.cache_directory(config.compilation_cache, "xla")


def _jax_directory() -> str | None:
    """The directory JAX's compilation cache is set to (a setting JAX declares at run time)."""
    return jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]


def enabled_directory() -> str | None:
    """The directory the engine's programs are cached in now (None: not cached)."""
    return _jax_directory() if _holders else None


def acquire() -> str | None:
    """Turns the cache on for the engine's programs (see the module docstring); returns the
    directory, or None when it is off. Pair every call with ``release()``."""
    global _holders, _ours
    _holders += 1
    if _holders > 1:
        return enabled_directory()
    user_directory = _jax_directory()
    if user_directory:
        jax_settings.set_cache_thresholds(True)
        return user_directory
    directory = default_directory()
    if directory is None:
        return None
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        # An unwritable cache location must not stop training: run without the cache.
        return None
    jax.config.update("jax_compilation_cache_dir", directory)
    _ours = directory
    jax_settings.set_cache_thresholds(True)
    return directory


def release() -> None:
    """Undoes ``acquire()``; the last release puts JAX's cache setting back as it was."""
    global _holders, _ours
    if _holders == 0:
        return
    _holders -= 1
    if _holders:
        return
    jax_settings.set_cache_thresholds(False)
    if _ours is not None and _jax_directory() == _ours:
        jax.config.update("jax_compilation_cache_dir", None)
        # JAX opened the directory once; forget it so later programs are not written there.
        from jax.experimental.compilation_cache import compilation_cache as _jax_cache

        _jax_cache.reset_cache()
    _ours = None
