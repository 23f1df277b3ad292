"""Matrix products. fp32 dots run at torch's float32 matmul precision (full by default); half
precision dots give half results, accumulated in fp32 (``_common.dot_result_dtype``).

A half-precision product on the CPU takes a transposed operand (``x @ w.t()``, as every
``nn.Linear`` is lowered) as its source with the dimension numbers swapped. XLA's CPU
compiler gives a transpose the layout of a column-major view, and its library dots
(YNNPACK) take only row-major operands, so such a bf16 dot was widened to float32 and ran at
half the speed (a 2048x256 by 256x1024 product: 5.3 against 2.7 ms on 2 Zen 4 cores). The
form ``lhs·rhsᵀ`` with row-major operands is one it takes. The same products of the same
values, accumulated in float32 and rounded once either way; only the order of the sums can
differ (a last-bit difference on a rare element, as between torch's kernels and XLA's).
The one bf16 form those dots refuse whatever the layout, a left operand contracted over its
rows (``aᵀ·b``: weight gradients, the attention's backward), gets its smaller operand copied
transposed by the engine's layout copy where the program has it (``ops/layout_copy.py``)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from jax_backend.errors import OpInputError
from jax_backend.ops import layout_copy, torch_kernels
from jax_backend.ops._common import dot_precision, dot_result_dtype, promote
from jax_backend.registry import TransposedOperand, lowers

aten = torch.ops.aten


def _operand(x, dims, fold):
    """One operand of a dot and its (contracting, batch) dims: a ``TransposedOperand``'s
    source with its last two dims swapped in ``dims`` where ``fold``, else its value."""
    if not isinstance(x, TransposedOperand):
        return x, dims
    if not fold:
        return x.value, dims
    if not x.flipped:
        return x.source, dims
    last = x.source.ndim - 1
    swap = {last: last - 1, last - 1: last}
    return x.source, tuple(tuple(swap.get(d, d) for d in part) for part in dims)


def dot(a, b, contracting, batch=((), ()), rounded=True):
    """``a·b`` in torch's result dtype; ``rounded=False`` leaves the accumulator's dtype
    (fp32 for half operands on the CPU), for a bias to join before the one rounding."""
    value = a.value if isinstance(a, TransposedOperand) else a
    fold = dot_result_dtype(value.dtype) is not None  # half operands on the CPU
    a, (lhs_contracting, lhs_batch) = _operand(a, (contracting[0], batch[0]), fold)
    b, (rhs_contracting, rhs_batch) = _operand(b, (contracting[1], batch[1]), fold)
    contracting, batch = (lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)
    # (float16 too is widened by XLA's CPU dots, whatever the layout, and so is a product
    # with a vector, mv's: no copy pays there.)
    if (
        a.dtype == jnp.bfloat16
        and layout_copy.applies()
        and _left_contracts_rows(a, lhs_contracting, lhs_batch)
        and b.ndim == len(rhs_batch) + 2
    ):
        return _dot_through_layout_copy(a, b, rhs_contracting, rhs_batch, rounded)
    if rounded and contracting == ((0,), (0,)) and torch_kernels.leading_contraction_applies(a, b):
        return torch_kernels.leading_contraction(a, b)
    if a.dtype != b.dtype:  # torch's matrix products never promote (autocast casts first)
        raise OpInputError(
            f"expected both operands of a matrix product to have the same dtype, but got "
            f"{a.dtype} and {b.dtype} (torch: mat1 and mat2 must have the same dtype). Cast "
            "the input to the model's dtype, e.g. x.float(), or use cstorch.amp for mixed "
            "precision."
        )
    out = lax.dot_general(
        a,
        b,
        (contracting, batch),
        precision=dot_precision(a, b),
        preferred_element_type=dot_result_dtype(a.dtype),
    )
    return out.astype(a.dtype) if rounded else out


def _left_contracts_rows(a, contracting, batch) -> bool:
    """Whether ``a``, batched over its leading dims, is contracted over its rows (its second
    last dim): ``aᵀ·b``, the form XLA's CPU library dots refuse for half operands."""
    return tuple(contracting) == (a.ndim - 2,) and tuple(batch) == tuple(range(a.ndim - 2))


def _dot_through_layout_copy(a, b, rhs_contracting, rhs_batch, rounded):
    """``aᵀ·b`` (``a`` contracted over its rows) with one operand copied transposed by the
    engine's layout copy, so that XLA's half-precision kernels take the product
    (``ops/layout_copy.py``). The smaller operand is copied: ``a`` itself, or, where ``b`` is
    batched like ``a`` and contracted over its rows too, ``b``, computing ``(bᵀ·a)ᵀ``."""
    rows = a.ndim - 2
    batch = tuple(range(rows))
    if _left_contracts_rows(b, rhs_contracting, rhs_batch) and b.shape[-1] < a.shape[-1]:
        out = dot(layout_copy.swap_last_two(b), a, ((rows + 1,), (rows,)), (batch, batch), rounded)
        return jnp.swapaxes(out, -1, -2)
    return dot(
        layout_copy.swap_last_two(a),
        b,
        ((rows + 1,), tuple(rhs_contracting)),
        (batch, tuple(rhs_batch)),
        rounded,
    )


def matmul_2d(a, b):
    return dot(a, b, ((1,), (0,)))


def matmul_batched(a, b):
    return dot(a, b, ((2,), (1,)), ((0,), (0,)))


def _scale_add(result, bias, beta, alpha, dtype=None):
    """``alpha·result + beta·bias``, rounded to ``dtype`` once at the end. With half operands
    on the CPU ``result`` is still the fp32 accumulator, so the bias joins before the rounding,
    as in torch's CPU GEMMs (and cuBLAS's bias epilogue, which XLA's GPU GEMMs use for the
    same pattern): adding it after rounding rounds twice."""
    if alpha != 1:
        result = result * alpha
    if beta != 0:
        bias = bias.astype(result.dtype)
        result = result + (bias if beta == 1 else bias * beta)
    return result if dtype is None else result.astype(dtype)


@lowers(aten.mm.default, transposed_operands=(0, 1))
def aten_mm(a, b):
    return matmul_2d(a, b)


@lowers(aten.bmm.default, transposed_operands=(0, 1))
def aten_bmm(a, b):
    return matmul_batched(a, b)


@lowers(aten.addmm.default, transposed_operands=(1, 2))
def aten_addmm(bias, a, b, *, beta=1, alpha=1):
    return _scale_add(dot(a, b, ((1,), (0,)), rounded=False), bias, beta, alpha, a.dtype)


@lowers(aten.baddbmm.default, transposed_operands=(1, 2))
def aten_baddbmm(bias, a, b, *, beta=1, alpha=1):
    product = dot(a, b, ((2,), (1,)), ((0,), (0,)), rounded=False)
    return _scale_add(product, bias, beta, alpha, a.dtype)


@lowers(aten.addbmm.default)
def aten_addbmm(bias, a, b, *, beta=1, alpha=1):
    return _scale_add(jnp.sum(matmul_batched(a, b), axis=0), bias, beta, alpha)


@lowers(aten.mv.default)
def aten_mv(a, v):
    return dot(a, v, ((1,), (0,)))


@lowers(aten.addmv.default)
def aten_addmv(bias, a, v, *, beta=1, alpha=1):
    return _scale_add(dot(a, v, ((1,), (0,)), rounded=False), bias, beta, alpha, a.dtype)


@lowers(aten.dot.default, aten.vdot.default)
def aten_dot(a, b):
    return dot(a, b, ((0,), (0,)))


@lowers(aten.outer.default)
def aten_outer(a, b):
    a, b = promote(a, b)
    return a[:, None] * b[None, :]


@lowers(aten._cdist_forward.default)
def aten_cdist(x1, x2, p, compute_mode=None):
    return _pairwise_norm(x1[..., :, None, :] - x2[..., None, :, :], p)


def _pairwise_norm(diff, p):
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum((a != 0).astype(diff.dtype), axis=-1)
    if p == float("inf"):
        return jnp.max(a, axis=-1)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    return jnp.sum(a**p, axis=-1) ** (1.0 / p)


def _pairwise_norm_grad(diff, dist, p):
    """d dist / d diff, with torch's conventions: 0 where the distance is 0, and for p=inf
    every coordinate attaining the maximum gets the sign."""
    dist = dist[..., None]
    zero = jnp.zeros((), diff.dtype)
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return jnp.sign(diff)
    if p == float("inf"):
        return jnp.where(jnp.abs(diff) == dist, jnp.sign(diff), zero)
    safe = jnp.where(dist == 0, jnp.ones((), dist.dtype), dist)
    if p == 2:
        return jnp.where(dist == 0, zero, diff / safe)
    if p < 1:
        grad = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)
        return jnp.where((dist == 0) | (diff == 0), zero, grad)
    return jnp.where(dist == 0, zero, diff * jnp.abs(diff) ** (p - 2) / safe ** (p - 1))


# - func: _pdist_forward(Tensor self, float p=2.) -> Tensor
@lowers(aten._pdist_forward.default)
def aten_pdist_forward(x, p=2.0):
    i, j = np.triu_indices(x.shape[0], 1)
    return _pairwise_norm(x[i] - x[j], p)


# - func: _pdist_backward(Tensor grad, Tensor self, float p, Tensor pdist) -> Tensor
@lowers(aten._pdist_backward.default)
def aten_pdist_backward(grad, x, p, pdist):
    i, j = np.triu_indices(x.shape[0], 1)
    g = grad[:, None] * _pairwise_norm_grad(x[i] - x[j], pdist, p)
    return jnp.zeros_like(x).at[i].add(g).at[j].add(-g)


# - func: _cdist_backward(Tensor grad, Tensor x1, Tensor x2, float p, Tensor cdist) -> Tensor
@lowers(aten._cdist_backward.default)
def aten_cdist_backward(grad, x1, x2, p, cdist):
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    if diff.size == 0:  # torch returns zeros shaped like x1 for empty inputs
        return jnp.zeros_like(x1)
    # The result keeps the broadcast batch dims; autograd sums them back to x1's shape.
    return jnp.sum(grad[..., None] * _pairwise_norm_grad(diff, cdist, p), axis=-2)
