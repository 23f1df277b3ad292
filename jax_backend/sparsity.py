"""Weight-sparsity mask maths as pure JAX functions (the engine side of ``cstorch.sparse``).

Masks are boolean arrays of a parameter's shape. Every function here is jit-friendly: the
number of kept elements may be a traced value (a sparsity schedule evaluated at a traced step),
so top-k is a threshold search instead of ``lax.top_k``, whose ``k`` must be static. That keeps
one compiled program across mask updates, as on a Cerebras system.

Counts follow cerebras-pytorch 2.10 exactly: ``k = int(float32(1 - sparsity) * float32(n))``
(truncation), drop counts ``int(float32(1 - drop_fraction) * nnz / groups)``. Ties in a score
keep the lower flat index first, except in ``mask_topk_sparsity(..., ties="torch_cpu")``,
which keeps the ones ``torch.topk`` on CPU keeps (the reference's CPU path: among pruned,
zero-valued weights that choice decides which ones regrow when sparsity falls).

Balanced sparsity ("groups") scores sub-blocks independently: ``("out", G)`` views a
``[G*o, i]`` weight as ``G`` rows of ``o*i`` scores, ``("in", G)`` views ``[o, G*i]`` as ``G``
rows of ``o*i`` scores taken column-wise; ``None`` is one global competition.

>>> import jax.numpy as jnp
>>> score = jnp.array([[1.0, 2.0], [0.0, -1.0]])
>>> mask_topk_sparsity(score, 0.5)
Array([[ True,  True],
       [False, False]], dtype=bool)
>>> mask_topk_sparsity(score, 0.5, ("out", 2))
Array([[False,  True],
       [ True, False]], dtype=bool)
"""

from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from jax_backend.errors import CstorchValueError

Shaper = Optional[Tuple[str, int]]  # None, ("out", groups) or ("in", groups)

_F32 = jnp.float32


def check_shaper(shaper: Shaper, shape) -> None:
    """Raises ValueError when ``shaper`` cannot split a tensor of ``shape`` evenly."""
    if shaper is None:
        return
    kind, groups = shaper
    if kind not in ("out", "in"):
        raise CstorchValueError(
            f"A score shaper is ('out', groups) or ('in', groups), got {shaper!r}."
        )
    if kind == "in" and len(shape) != 2:
        raise CstorchValueError(
            f"Input-balanced groups need a 2-D weight, got shape {tuple(shape)}."
        )
    dim = shape[0] if kind == "out" else shape[1]
    if int(groups) <= 0 or dim % int(groups):
        raise CstorchValueError(
            f"Cannot balance {kind}put groups of size {groups} over a weight of shape "
            f"{tuple(shape)}: its {kind}put dimension ({dim}) is not a multiple of {groups}."
        )


def shape_scores(x, shaper: Shaper = None):
    """``x`` as a ``[groups, n]`` array of independent competitions, and the inverse map."""
    shape = x.shape
    if shaper is None:
        return x.reshape(1, -1), lambda y: y.reshape(shape)
    check_shaper(shaper, shape)
    kind, groups = shaper
    if kind == "out":
        return x.reshape(groups, -1), lambda y: y.reshape(shape)
    rows, cols = shape
    shaped = x.T.reshape(groups, -1)
    return shaped, lambda y: y.reshape(cols, rows).T


def num_dense(density, n):
    """``int(float32(density) * float32(n))``, the reference's kept-element count (int32)."""
    return (jnp.asarray(density, _F32) * jnp.asarray(n, _F32)).astype(jnp.int32)


def _order_keys(score):
    """Unsigned integers ordered like the float ``score`` (-0.0 counts as 0.0), and their
    bit width: float64 keeps 64 bits, everything else is compared as float32."""
    if score.dtype == jnp.float64:
        ftype, utype, bits = jnp.float64, jnp.uint64, 64
    else:
        ftype, utype, bits = jnp.float32, jnp.uint32, 32
    score = score.astype(ftype)
    score = jnp.where(score == 0, ftype(0.0), score)  # (x + 0.0 is simplified away by XLA)
    raw = lax.bitcast_convert_type(score, utype)
    top = utype(1) << utype(bits - 1)
    negative = (raw & top) != 0
    return jnp.where(negative, ~raw, raw | top), utype, bits


def topk_rows(score, k):
    """A boolean ``[groups, n]`` mask keeping the ``k`` largest scores of each row.

    ``k`` may be a traced integer (clipped to ``[0, n]``); ties keep the lower index. The
    k-th largest value is found by a bitwise binary search over order-preserving integer keys
    (one compare-and-count pass per bit) rather than by sorting, which XLA does slowly on CPU.
    """
    keys, utype, bits = _order_keys(score)
    k = jnp.clip(jnp.asarray(k, jnp.int32), 0, score.shape[-1])[..., None]

    def refine(i, threshold):  # builds the largest t with count(keys >= t) >= k, bit by bit
        candidate = threshold | (utype(1) << (utype(bits - 1) - i.astype(utype)))
        enough = jnp.sum(keys >= candidate, axis=-1, keepdims=True, dtype=jnp.int32) >= k
        return jnp.where(enough, candidate, threshold)

    # A loop, not 32 unrolled passes: XLA compiles unrolled multi-row searches very slowly.
    threshold = lax.fori_loop(0, bits, refine, jnp.zeros(score.shape[:-1] + (1,), utype))
    above = keys > threshold
    remaining = k - jnp.sum(above, axis=-1, keepdims=True, dtype=jnp.int32)
    at = keys == threshold
    return above | (at & (jnp.cumsum(at, axis=-1, dtype=jnp.int32) <= remaining))


def _torch_topk_rows_on_host(score, k):
    rows = torch.from_numpy(np.array(score))
    indices = torch.topk(rows, int(k), dim=-1).indices
    return torch.zeros(rows.shape, dtype=torch.bool).scatter_(-1, indices, True).numpy()


def topk_rows_like_torch_cpu(score, k):
    """``topk_rows`` with torch's CPU choice among equal scores: ``torch.topk`` itself, run
    on the host (its order among ties comes from a selection algorithm, not from the index).
    """
    if score.dtype != jnp.float64:
        score = score.astype(_F32)  # order-preserving for every narrower float
    k = jnp.clip(jnp.asarray(k, jnp.int32), 0, score.shape[-1])
    return jax.pure_callback(
        _torch_topk_rows_on_host, jax.ShapeDtypeStruct(score.shape, jnp.bool_), score, k
    )


TIES = ("lower_index", "torch_cpu")


def mask_topk_sparsity(score, sparsity, shaper: Shaper = None, ties: str = "lower_index"):
    """Keeps the top ``(1 - sparsity)`` fraction of ``score`` (per group); ``ties`` picks
    among equal scores (module docstring)."""
    if ties not in TIES:
        raise CstorchValueError(f"ties must be one of {TIES}, got {ties!r}.")
    shaped, unshape = shape_scores(score, shaper)
    k = num_dense(1.0 - jnp.asarray(sparsity, _F32), shaped.shape[-1])
    rows = topk_rows_like_torch_cpu if ties == "torch_cpu" else topk_rows
    return unshape(rows(shaped, k))


def mask_drop_minimum(score, mask, drop_fraction, shaper: Shaper = None):
    """Drops the lowest-scoring ``drop_fraction`` of the present connections of ``mask``.

    Returns ``(new_mask, kept)`` where ``kept`` is the int32 number of connections kept per
    group: ``int((1 - drop_fraction) * nnz(mask) / groups)``."""
    shaped, unshape = shape_scores(score, shaper)
    groups = shaped.shape[0]
    current = jnp.sum(mask).astype(_F32) / jnp.asarray(groups, _F32)
    kept = ((1.0 - jnp.asarray(drop_fraction, _F32)) * current).astype(jnp.int32)
    return unshape(topk_rows(shaped, kept)), kept


def mask_grow_maximum(score, mask, sparsity, mask_nonzero=None, shaper: Shaper = None):
    """Regrows the highest-scoring pruned positions of ``mask`` until each group holds
    ``int((1 - sparsity) * n)`` connections; never drops any (a denser ``mask`` is kept)."""
    score = jnp.where(mask, -jnp.inf, score)
    shaped, unshape = shape_scores(score, shaper)
    target = num_dense(1.0 - jnp.asarray(sparsity, _F32), shaped.shape[-1])
    if mask_nonzero is None:
        mask_nonzero = jnp.sum(mask).astype(jnp.int32)
    grow = jnp.maximum(target - jnp.asarray(mask_nonzero, jnp.int32), 0)
    return jnp.logical_or(mask, unshape(topk_rows(shaped, grow)))


def prune(x, mask):
    """``x`` with pruned positions zeroed (``x * mask``, keeping ``x``'s dtype)."""
    return x * mask.astype(x.dtype)


def masked_gradient(grad, mask):
    """``grad`` zeroed where pruned, by selection so that NaNs of pruned positions vanish."""
    return jnp.where(mask, grad, jnp.zeros_like(grad))


def gmp_update(param, mask, sparsity, is_update_step, shaper: Shaper = None):
    """Gradual magnitude pruning: on an update step, the top-|w| mask at ``sparsity``
    (computed only on update steps: a ``lax.cond``)."""
    return lax.cond(
        jnp.asarray(is_update_step, bool),
        lambda: mask_topk_sparsity(jnp.abs(param), sparsity, shaper),
        lambda: jnp.asarray(mask, bool),
    )


def set_update(
    param, mask, sparsity, drop_fraction, regrow_score, is_update_step, shaper: Shaper = None
):
    """SET: drop the smallest |w| of the present connections, regrow at the highest
    ``regrow_score`` (uniform random numbers in SET) to reach ``sparsity``."""

    def update():
        dropped, kept = mask_drop_minimum(jnp.abs(param), mask, drop_fraction, shaper)
        return mask_grow_maximum(regrow_score, dropped, sparsity, kept, shaper)

    return lax.cond(jnp.asarray(is_update_step, bool), update, lambda: jnp.asarray(mask, bool))


def rigl_update(
    param, mask, sparsity, drop_fraction, dense_grad, is_update_step, shaper: Shaper = None
):
    """RigL: like SET, regrowing where the dense gradient's magnitude is largest."""
    return set_update(
        param, mask, sparsity, drop_fraction, jnp.abs(dense_grad), is_update_step, shaper
    )
