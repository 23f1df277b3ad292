"""torch custom ops for ``cstorch.sparse`` whose meaning is ``jax_backend.sparsity``.

A traced sparsity update calls these ops on tensors of the step; each becomes one graph node
lowered to the pure JAX function (so the mask maths has a single definition), and runs the
same JAX code eagerly outside a traced step (e.g. mask initialisation). The number of kept
elements is a traced value, so a changing sparsity never recompiles the step.

``shaper`` is ``""`` (one global competition), ``"out:G"`` or ``"in:G"`` (balanced groups,
see ``jax_backend.sparsity``). ``when`` (a bool tensor, the step's ``is_update_step``) makes
the op a ``lax.cond``: steps that keep their masks skip the top-k work entirely.
"""

from __future__ import annotations

from typing import Tuple

import jax.numpy as jnp
import torch
from jax import lax

from jax_backend import sparsity
from jax_backend.dtypes import array_to_tensor, tensor_to_array
from jax_backend.jax_settings import engine_scope
from jax_backend.registry import lowers


def _shaper(spec: str):
    if not spec:
        return None
    kind, groups = spec.split(":")
    return kind, int(groups)


def _only_when(when, compute, skipped):
    """``compute()`` where ``when`` is true, else the cheap ``skipped()``: masks are only
    recomputed on update steps (the caller selects the old mask on the others)."""
    return lax.cond(jnp.asarray(when, bool), compute, skipped)


def _topk_jax(score, sparsity_level, when, shaper, ties="lower_index"):
    return _only_when(
        when,
        lambda: sparsity.mask_topk_sparsity(score, sparsity_level, _shaper(shaper), ties),
        lambda: jnp.zeros(score.shape, bool),
    )


def _drop_jax(score, mask, drop_fraction, when, shaper):
    return _only_when(
        when,
        lambda: sparsity.mask_drop_minimum(score, mask, drop_fraction, _shaper(shaper)),
        lambda: (jnp.asarray(mask, bool), jnp.zeros((), jnp.int32)),
    )


def _grow_jax(score, mask, sparsity_level, mask_nonzero, when, shaper):
    return _only_when(
        when,
        lambda: sparsity.mask_grow_maximum(
            score, mask, sparsity_level, mask_nonzero, _shaper(shaper)
        ),
        lambda: jnp.asarray(mask, bool),
    )


def _arrays(*tensors):
    return [tensor_to_array(t) for t in tensors]


@torch.library.custom_op("cstorch::sparse_topk_mask", mutates_args=())
def topk_mask(
    score: torch.Tensor,
    sparsity_level: torch.Tensor,
    when: torch.Tensor,
    shaper: str,
    ties: str = "lower_index",
) -> torch.Tensor:
    """A bool mask keeping the top ``1 - sparsity_level`` fraction of ``score`` (all False
    where ``when`` is false); ``ties``: see ``jax_backend.sparsity``."""
    with engine_scope():
        arrays = _arrays(score, sparsity_level, when)
        return array_to_tensor(_topk_jax(*arrays, shaper, ties))  # type: ignore[call-arg]


@topk_mask.register_fake
def _topk_fake(score, sparsity_level, when, shaper, ties="lower_index"):
    return torch.empty(score.shape, dtype=torch.bool)


@torch.library.custom_op("cstorch::sparse_drop_minimum", mutates_args=())
def drop_minimum(
    score: torch.Tensor,
    mask: torch.Tensor,
    drop_fraction: torch.Tensor,
    when: torch.Tensor,
    shaper: str,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(mask without its lowest-scoring drop_fraction, kept count per group as int32)``
    (``(mask, 0)`` where ``when`` is false)."""
    with engine_scope():
        arrays = _arrays(score, mask, drop_fraction, when)
        new, kept = _drop_jax(*arrays, shaper)  # type: ignore[call-arg]
    return array_to_tensor(new), array_to_tensor(kept)


@drop_minimum.register_fake
def _drop_fake(score, mask, drop_fraction, when, shaper):
    return torch.empty(score.shape, dtype=torch.bool), torch.empty((), dtype=torch.int32)


@torch.library.custom_op("cstorch::sparse_grow_maximum", mutates_args=())
def grow_maximum(
    score: torch.Tensor,
    mask: torch.Tensor,
    sparsity_level: torch.Tensor,
    mask_nonzero: torch.Tensor,
    when: torch.Tensor,
    shaper: str,
) -> torch.Tensor:
    """``mask`` plus the highest-scoring pruned positions, up to the target density
    (``mask`` itself where ``when`` is false)."""
    with engine_scope():
        arrays = _arrays(score, mask, sparsity_level, mask_nonzero, when)
        return array_to_tensor(_grow_jax(*arrays, shaper))  # type: ignore[call-arg]


@grow_maximum.register_fake
def _grow_fake(score, mask, sparsity_level, mask_nonzero, when, shaper):
    return torch.empty(score.shape, dtype=torch.bool)


lowers(torch.ops.cstorch.sparse_topk_mask.default)(_topk_jax)
lowers(torch.ops.cstorch.sparse_drop_minimum.default)(lambda *a: tuple(_drop_jax(*a)))
lowers(torch.ops.cstorch.sparse_grow_maximum.default)(_grow_jax)
