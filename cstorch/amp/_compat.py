"""API-compatible stand-ins for the apex-derived pieces of cerebras' amp.

The casting machinery they configure on CSX is replaced here by capture-time autocast
(``jax_backend.precision``), so these keep their signatures and validation and do no casting.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from jax_backend.errors import CstorchValueError


def init(enabled=True, enable_caching=True, verbose=False, allow_banned=False):
    """Accepted for compatibility; mixed precision is configured with set_half_dtype."""
    return None


def _identity_decorator(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


half_function = float_function = promote_function = _identity_decorator


def _register(module, name):
    if not hasattr(module, name):
        raise CstorchValueError(f"No function named {name} in module {module}.")


register_half_function = register_float_function = register_promote_function = _register


@contextlib.contextmanager
def disable_casts():
    with torch.autocast("cpu", enabled=False):
        yield


def isfinite(optimizer):
    """Whether the gradients of ``optimizer``'s last loss-scaled step were finite."""
    stash = getattr(optimizer, "_amp_stash", None)
    value = getattr(stash, "isfinite", None)
    return torch.tensor(True) if value is None else value


def update_if_finite(optimizer, tensor):
    """Accepted for compatibility: conditional updates are explicit in cstorch-jax (see
    ``GradScaler.step_if_finite`` and ``finite_increment``)."""
    return tensor


def finite_increment(optimizer):
    """How far a counter tied to ``optimizer`` advances this step: 1, or — while a dynamic
    GradScaler checked this step's gradients — 1 if they were finite and 0 if the update was
    skipped (so schedulers do not advance on skipped steps, as in cerebras-pytorch)."""
    increment = getattr(optimizer, "_finite_increment", None)
    return increment() if increment is not None else 1
