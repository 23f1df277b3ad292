"""JAX's persistent compilation cache, on by default, so a second run skips XLA compilation.

The cache is JAX's own: an entry is keyed by the lowered module, the compile options, the
device kind and the jax/jaxlib versions, so a changed step, model, input shape or version
misses and compiles afresh; a stale program can never be used. Entries are plain files and
the directory is safe to delete at any time.

Where it lives, in order:
* ``CSTORCH_COMPILATION_CACHE``: a directory, or ``off`` (also ``0``, ``false``, empty) to disable
  (``on`` names the default below);
* otherwise ``$XDG_CACHE_HOME/cstorch-jax/xla`` (``~/.cache/cstorch-jax/xla``).

A directory set explicitly with ``jax.config.update("jax_compilation_cache_dir", ...)`` before
the engine is imported wins over both.
"""

from __future__ import annotations

import os

import jax

ENV_VAR = "CSTORCH_COMPILATION_CACHE"
_DISABLED = {"", "0", "off", "false", "no"}
_ENABLED = {"1", "on", "true", "yes"}


def cache_directory(env_var: str, name: str, default_on: bool = True) -> str | None:
    """The directory ``env_var`` asks for: None when it says ``off`` (or is unset and not
    ``default_on``), ``name`` under ``$XDG_CACHE_HOME/cstorch-jax`` (``~/.cache/cstorch-jax``)
    when it says ``on`` (or is unset and ``default_on``). Shared by the project's caches."""
    value = os.environ.get(env_var)
    if value is None:
        if not default_on:
            return None
    elif value.strip().lower() in _DISABLED:
        return None
    elif value.strip().lower() not in _ENABLED:
        return os.path.expanduser(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cstorch-jax", name)


def default_directory() -> str | None:
    """The cache directory the environment asks for, or None when it is switched off."""
    return cache_directory(ENV_VAR, "xla")


def enable(directory: str | None) -> str | None:
    """Points JAX's persistent cache at ``directory`` (None disables it); returns the directory.

    Every program is cached, however small or quick to compile: the programs of a training
    script are few, and first-step time is what a warm start is about.
    """
    if directory is None:
        jax.config.update("jax_compilation_cache_dir", None)
        return None
    os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory


def enable_default() -> str | None:
    """Applies the environment's choice unless a directory was configured already."""
    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    try:
        return enable(default_directory())
    except OSError:
        # An unwritable cache location must not stop training: run without the cache.
        return None
