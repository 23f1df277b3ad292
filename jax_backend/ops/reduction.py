"""Reductions, scans, norms, softmax, sorting."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from jax_backend import native_loss, target
from jax_backend.dtypes import promote
from jax_backend.ops._common import (
    as_float,
    canon_dim,
    canon_dims,
    compute_dtype,
    jax_dtype,
    sum_dtype,
)
from jax_backend.registry import lowers

aten = torch.ops.aten


@lowers(aten.sum.dim_IntList)
def aten_sum(x, dim=None, keepdim=False, dtype=None):
    dtype = jax_dtype(dtype, sum_dtype(x))
    x, axes = x.astype(dtype), canon_dims(dim, x.ndim)
    if _is_wide_outer_sum(x, axes):
        return _outer_sum_as_dot(x, len(axes), keepdim)
    return jnp.sum(x, axis=axes, keepdims=keepdim)


# XLA's CPU library reductions (YNNPACK) slow down ~20-60x on a sum over leading axes that
# keeps more than ~16 000 elements: [16, 128, 256] summed over the batch (a position
# embedding's gradient) took 1.2-2.1 ms against 0.07 as a product with a ones vector, and
# [8, 1024, 768] 26 ms against 0.5. The product is as fast or faster from a few thousand
# kept elements, so such sums are lowered as one on the CPU.
WIDE_OUTER_SUM = 4096


def _is_wide_outer_sum(x, axes) -> bool:
    return (
        target.current().platform == "cpu"
        and x.dtype in (jnp.float32, jnp.float64)
        and 0 < len(axes) < x.ndim
        and axes == tuple(range(len(axes)))
        and math.prod(x.shape[len(axes) :]) >= WIDE_OUTER_SUM
    )


def _outer_sum_as_dot(x, leading: int, keepdim: bool):
    """The sum of ``x`` over its first ``leading`` axes as ones · x (a float32 sum of the
    same terms: each product is exact; the order of the additions is the kernel's)."""
    kept = x.shape[leading:]
    rows = x.reshape(math.prod(x.shape[:leading]), math.prod(kept))
    ones = jnp.ones(rows.shape[0], x.dtype)
    out = lax.dot_general(ones, rows, (((0,), (0,)), ((), ())), precision=lax.Precision.HIGHEST)
    return out.reshape(((1,) * leading if keepdim else ()) + kept)


@lowers(aten.sum.default)
def aten_sum_all(x, dtype=None):
    return aten_sum(x, None, False, dtype)


@lowers(aten.mean.dim)
def aten_mean(x, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    return jnp.mean(x, axis=canon_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.mean.default)
def aten_mean_all(x, dtype=None):
    return aten_mean(x, None, False, dtype)


@lowers(aten.prod.dim_int)
def aten_prod(x, dim, keepdim=False, dtype=None):
    dtype = jax_dtype(dtype, sum_dtype(x))
    return jnp.prod(x.astype(dtype), axis=canon_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.prod.default)
def aten_prod_all(x, dtype=None):
    dtype = jax_dtype(dtype, sum_dtype(x))
    return jnp.prod(x.astype(dtype))


@lowers(aten.amax.default)
def aten_amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=canon_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.amin.default)
def aten_amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=canon_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.max.default)
def aten_max_all(x):
    return jnp.max(x)


@lowers(aten.min.default)
def aten_min_all(x):
    return jnp.min(x)


def _arg_extreme(x, dim, keepdim, find_max):
    """Index of the first max/min along dim; NaN counts as the extreme value, as in torch."""
    if dim is None:
        flat = x.reshape(-1)
        idx = _arg_extreme(flat, 0, False, find_max)
        return idx.reshape((1,) * x.ndim) if keepdim else idx
    axis = canon_dim(dim, x.ndim)
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        nan = jnp.isnan(x)
        has_nan = jnp.any(nan, axis=axis, keepdims=True)
        x = (
            jnp.where(has_nan, nan.astype(x.dtype), x)
            if find_max
            else jnp.where(has_nan, (-nan.astype(x.dtype)), x)
        )
    idx = (
        jnp.argmax(x, axis=axis, keepdims=keepdim)
        if find_max
        else jnp.argmin(x, axis=axis, keepdims=keepdim)
    )
    return idx.astype(jnp.int64)


@lowers(aten.argmax.default)
def aten_argmax(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, True)


@lowers(aten.argmin.default)
def aten_argmin(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, False)


@lowers(aten.max.dim)
def aten_max_dim(x, dim, keepdim=False):
    axes = canon_dims(dim, x.ndim)
    return jnp.max(x, axis=axes, keepdims=keepdim), _arg_extreme(x, dim, keepdim, True)


@lowers(aten.min.dim)
def aten_min_dim(x, dim, keepdim=False):
    axes = canon_dims(dim, x.ndim)
    return jnp.min(x, axis=axes, keepdims=keepdim), _arg_extreme(x, dim, keepdim, False)


def _variance(x, dim, correction, keepdim):
    x = as_float(x)
    axes = canon_dims(dim, x.ndim)
    n = 1
    for a in axes:
        n *= x.shape[a]
    correction = 1 if correction is None else correction
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    if jnp.iscomplexobj(centered):
        sq = jnp.real(centered * jnp.conj(centered))
    else:
        sq = centered * centered
    total = jnp.sum(sq, axis=axes, keepdims=keepdim)
    return total / max(n - correction, 0), mean if keepdim else jnp.squeeze(mean, axes)


@lowers(aten.var.correction)
def aten_var(x, dim=None, *, correction=None, keepdim=False):
    return _variance(x, dim, correction, keepdim)[0]


@lowers(aten.var.dim)
def aten_var_dim(x, dim, unbiased=True, keepdim=False):
    return _variance(x, dim, 1 if unbiased else 0, keepdim)[0]


@lowers(aten.var_mean.correction)
def aten_var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _variance(x, dim, correction, keepdim)


@lowers(aten.std.correction)
def aten_std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_variance(x, dim, correction, keepdim)[0])


@lowers(aten.any.default)
def aten_any_all(x):
    return jnp.any(x)


@lowers(aten.any.dim)
def aten_any(x, dim, keepdim=False):
    return jnp.any(x, axis=canon_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.any.dims)
def aten_any_dims(x, dim=None, keepdim=False):
    return jnp.any(x, axis=canon_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.all.default)
def aten_all_all(x):
    return jnp.all(x)


@lowers(aten.all.dim)
def aten_all(x, dim, keepdim=False):
    return jnp.all(x, axis=canon_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.all.dims)
def aten_all_dims(x, dim=None, keepdim=False):
    return jnp.all(x, axis=canon_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.cumsum.default)
def aten_cumsum(x, dim, *, dtype=None):
    dtype = jax_dtype(dtype, sum_dtype(x))
    if x.ndim == 0:
        return x.astype(dtype)
    return jnp.cumsum(x.astype(dtype), axis=canon_dim(dim, x.ndim))


@lowers(aten.cumprod.default)
def aten_cumprod(x, dim, *, dtype=None):
    dtype = jax_dtype(dtype, sum_dtype(x))
    if x.ndim == 0:
        return x.astype(dtype)
    return jnp.cumprod(x.astype(dtype), axis=canon_dim(dim, x.ndim))


@lowers(aten.logcumsumexp.default)
def aten_logcumsumexp(x, dim):
    axis = canon_dim(dim, x.ndim)
    return lax.cumlogsumexp(as_float(x), axis=axis) if x.ndim else x


def _cum_extreme(x, dim, take_max):
    axis = canon_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    idx = lax.broadcasted_iota(jnp.int64, x.shape, axis)

    def combine(a, b):
        va, ia = a
        vb, ib = b
        if jnp.issubdtype(va.dtype, jnp.inexact):
            better = (vb >= va) if take_max else (vb <= va)
            better = better | jnp.isnan(vb) & ~jnp.isnan(va)
            better = better & ~(jnp.isnan(va) & ~jnp.isnan(vb))
        else:
            better = (vb >= va) if take_max else (vb <= va)
        return jnp.where(better, vb, va), jnp.where(better, ib, ia)

    return lax.associative_scan(combine, (x, idx), axis=axis)


@lowers(aten.cummax.default)
def aten_cummax(x, dim):
    return _cum_extreme(x, dim, True)


@lowers(aten.cummin.default)
def aten_cummin(x, dim):
    return _cum_extreme(x, dim, False)


@lowers(aten.linalg_vector_norm.default)
def aten_linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    x = as_float(x)
    axes = canon_dims(dim, x.ndim)
    a = jnp.abs(x)
    if ord == float("inf"):
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@lowers(aten._softmax.default)
def aten_softmax(x, dim, half_to_float=False):
    if half_to_float:
        x = x.astype(jnp.float32)
    return jax.nn.softmax(x, axis=canon_dim(dim, x.ndim))


@lowers(aten._log_softmax.default)
def aten_log_softmax(x, dim, half_to_float=False):
    if half_to_float:
        x = x.astype(jnp.float32)
    axis = canon_dim(dim, x.ndim)
    if native_loss.log_softmax_applies(x, axis):  # the engine's CPU program
        return native_loss.log_softmax(x)
    return jax.nn.log_softmax(x, axis=axis)


@lowers(aten._softmax_backward_data.default)
def aten_softmax_backward(grad, output, dim, input_dtype):
    axis = canon_dim(dim, output.ndim)
    g = grad * output
    return (g - output * jnp.sum(g, axis=axis, keepdims=True)).astype(jax_dtype(input_dtype))


@lowers(aten._log_softmax_backward_data.default)
def aten_log_softmax_backward(grad, output, dim, input_dtype):
    """In float32 for half operands, rounded once (as torch's kernel and decomposition)."""
    axis = canon_dim(dim, output.ndim)
    if (
        grad.dtype == jnp.float32
        and jax_dtype(input_dtype) == jnp.float32
        and native_loss.log_softmax_applies(output, axis)
    ):
        return native_loss.log_softmax_backward(grad, output)
    opmath = compute_dtype(output)
    grad, output = grad.astype(opmath), output.astype(opmath)
    result = grad - jnp.exp(output) * jnp.sum(grad, axis=axis, keepdims=True)
    return result.astype(jax_dtype(input_dtype))


@lowers(aten.logsumexp.default)
def aten_logsumexp(x, dim, keepdim=False):
    return jax.nn.logsumexp(as_float(x), axis=canon_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.sort.default)
def aten_sort(x, dim=-1, descending=False):
    return aten_sort_stable(x, stable=False, dim=dim, descending=descending)


@lowers(aten.sort.stable)
def aten_sort_stable(x, *, stable=None, dim=-1, descending=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canon_dim(dim, x.ndim)
    idx = jnp.argsort(x, axis=axis, stable=True, descending=descending).astype(jnp.int64)
    return jnp.take_along_axis(x, idx, axis=axis), idx


@lowers(aten.topk.default)
def aten_topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canon_dim(dim, x.ndim)
    moved = jnp.moveaxis(x, axis, -1)
    if largest:
        values, idx = lax.top_k(moved, k)
    else:
        order = jnp.argsort(moved, axis=-1, stable=True)[..., :k]
        values, idx = jnp.take_along_axis(moved, order, axis=-1), order
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(idx.astype(jnp.int64), -1, axis)


# ---------------------------------------------------------------------- order statistics
def _sorted_with_nan_last(x, axis):
    """Stable ascending sort along ``axis`` with NaN last; returns (values, indices)."""
    idx = jnp.argsort(x, axis=axis, stable=True)
    return jnp.take_along_axis(x, idx, axis=axis), idx.astype(jnp.int64)


def _select_rank(x, dim, keepdim, rank_fn):
    """Values and indices of the element of rank ``rank_fn(n, nan_count)`` along ``dim``."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canon_dim(dim, x.ndim)
    values, idx = _sorted_with_nan_last(x, axis)
    n = x.shape[axis]
    nan_count = (
        jnp.sum(jnp.isnan(x), axis=axis, keepdims=True)
        if jnp.issubdtype(x.dtype, jnp.inexact)
        else jnp.zeros(x.shape[:axis] + (1,) + x.shape[axis + 1 :], jnp.int64)
    )
    rank = jnp.clip(rank_fn(n, nan_count), 0, max(n - 1, 0)).astype(jnp.int64)
    v = jnp.take_along_axis(values, rank, axis=axis)
    i = jnp.take_along_axis(idx, rank, axis=axis)
    if not keepdim:
        v, i = jnp.squeeze(v, axis), jnp.squeeze(i, axis)
    return v, i


def _median_rank(n, nan_count):
    # The lower median; with a NaN present torch returns NaN (the first NaN in sorted order).
    return jnp.where(nan_count > 0, n - nan_count, (n - 1) // 2)


def _nanmedian_rank(n, nan_count):
    return jnp.where(nan_count == n, 0, (n - nan_count - 1) // 2)


@lowers(aten.median.dim)
def aten_median_dim(x, dim, keepdim=False):
    return _select_rank(x, dim, keepdim, _median_rank)


@lowers(aten.median.default)
def aten_median(x):
    return _select_rank(x.reshape(-1), 0, False, _median_rank)[0]


@lowers(aten.nanmedian.dim)
def aten_nanmedian_dim(x, dim, keepdim=False):
    return _select_rank(x, dim, keepdim, _nanmedian_rank)


@lowers(aten.nanmedian.default)
def aten_nanmedian(x):
    return _select_rank(x.reshape(-1), 0, False, _nanmedian_rank)[0]


@lowers(aten.kthvalue.default)
def aten_kthvalue(x, k, dim=-1, keepdim=False):
    return _select_rank(x, dim, keepdim, lambda n, nan_count: jnp.full(nan_count.shape, k - 1))


@lowers(aten.mode.default)
def aten_mode(x, dim=-1, keepdim=False):
    """The most frequent value (the smallest among ties) and its last index, as torch's CPU."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canon_dim(dim, x.ndim)
    moved = jnp.moveaxis(x, axis, -1)
    values, idx = _sorted_with_nan_last(moved, -1)
    n = moved.shape[-1]
    if n == 0:
        shape = moved.shape[:-1]
        return jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
    same = values[..., 1:] == values[..., :-1]
    if jnp.issubdtype(values.dtype, jnp.inexact):
        same = same | (jnp.isnan(values[..., 1:]) & jnp.isnan(values[..., :-1]))
    # Run length ending at each position.
    positions = jnp.arange(n)
    starts = jnp.concatenate([jnp.ones(same.shape[:-1] + (1,), jnp.bool_), ~same], axis=-1)
    run_start = lax.cummax(jnp.where(starts, positions, 0), axis=values.ndim - 1)
    run_length = positions - run_start + 1
    best = jnp.max(run_length, axis=-1, keepdims=True)
    end = jnp.argmax(run_length == best, axis=-1)[..., None]  # first (smallest) value's run end
    value = jnp.take_along_axis(values, end, axis=-1)[..., 0]
    # Last original index holding that value.
    match = moved == value[..., None]
    if jnp.issubdtype(x.dtype, jnp.inexact):
        match = match | (jnp.isnan(moved) & jnp.isnan(value)[..., None])
    index = (n - 1 - jnp.argmax(jnp.flip(match, -1), axis=-1)).astype(jnp.int64)
    del idx
    if keepdim:
        value, index = jnp.expand_dims(value, axis), jnp.expand_dims(index, axis)
    return value, index


# ------------------------------------------------------------------------------ searching
def _searchsorted(sorted_sequence, values, right, side, sorter):
    side = side or ("right" if right else "left")
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    if sorted_sequence.ndim == 1:
        return jnp.searchsorted(sorted_sequence, values, side=side)
    flat_seq = sorted_sequence.reshape(-1, sorted_sequence.shape[-1])
    flat_val = values.reshape(flat_seq.shape[0], -1)
    out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(flat_seq, flat_val)
    return out.reshape(values.shape)


@lowers(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def aten_searchsorted(
    sorted_sequence, values, *, out_int32=False, right=False, side=None, sorter=None
):
    values = (
        jnp.asarray(values, sorted_sequence.dtype)
        if not hasattr(values, "dtype")
        else (values.astype(promote(values.dtype, sorted_sequence.dtype)))
    )
    sorted_sequence = sorted_sequence.astype(values.dtype)
    out = _searchsorted(sorted_sequence, values, right, side, sorter)
    return out.astype(jnp.int32 if out_int32 else jnp.int64)


@lowers(aten.bucketize.Tensor, aten.bucketize.Scalar)
def aten_bucketize(x, boundaries, *, out_int32=False, right=False):
    x = jnp.asarray(x)
    dtype = promote(x.dtype, boundaries.dtype)
    out = jnp.searchsorted(
        boundaries.astype(dtype), x.astype(dtype), side="right" if right else "left"
    )
    return out.astype(jnp.int32 if out_int32 else jnp.int64)


@lowers(aten.histc.default)
def aten_histc(x, bins=100, min=0, max=0):
    """Bins span [min, max]; with min == max they span the data's range (static shape)."""
    data = x.reshape(-1)
    lo = jnp.asarray(min, x.dtype)
    hi = jnp.asarray(max, x.dtype)
    if min == max:
        lo = jnp.min(data) if data.size else jnp.zeros((), x.dtype)
        hi = jnp.max(data) if data.size else jnp.zeros((), x.dtype)
    equal = lo == hi
    lo = jnp.where(equal, lo - 1, lo)
    hi = jnp.where(equal, hi + 1, hi)
    inside = (data >= lo) & (data <= hi)
    position = ((data - lo) * bins / (hi - lo)).astype(jnp.int64)
    position = jnp.clip(position, 0, bins - 1)
    counts = jnp.zeros((bins,), x.dtype).at[position].add(inside.astype(x.dtype))
    return counts


# - func: histogram.bin_ct(Tensor self, int bins=100, *, float[]? range=None,
#   Tensor? weight=None, bool density=False) -> (Tensor hist, Tensor bin_edges)
@lowers(aten.histogram.bin_ct)
def aten_histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    """Equal-width bins over ``range`` (or the data's span, widened by 0.5 if empty)."""
    data = x.reshape(-1)
    if range is not None:
        lo, hi = jnp.asarray(range[0], x.dtype), jnp.asarray(range[1], x.dtype)
    else:
        lo = jnp.min(data) if data.size else jnp.zeros((), x.dtype)
        hi = jnp.max(data) if data.size else jnp.zeros((), x.dtype)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
    edges = lo + (hi - lo) * (jnp.arange(bins + 1, dtype=x.dtype) / bins)
    edges = edges.at[-1].set(hi)
    position = jnp.clip(jnp.searchsorted(edges, data, side="right") - 1, 0, bins - 1)
    inside = (data >= lo) & (data <= hi)
    w = jnp.ones_like(data) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros((bins,), x.dtype).at[position].add(jnp.where(inside, w, 0))
    if density:
        hist = hist / (jnp.sum(hist) * (edges[1:] - edges[:-1]))
    return hist, edges


@lowers(aten.histogram.bins_tensor)
def aten_histogram_bins_tensor(x, bins, *, weight=None, density=False):
    """Histogram over explicit (increasing) bin edges; the last bin includes its right edge."""
    data = x.reshape(-1)
    edges = bins.astype(x.dtype)
    count = edges.shape[0] - 1
    position = jnp.clip(jnp.searchsorted(edges, data, side="right") - 1, 0, max(count - 1, 0))
    inside = (data >= edges[0]) & (data <= edges[-1])
    w = jnp.ones_like(data) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros((count,), x.dtype).at[position].add(jnp.where(inside, w, 0))
    if density:
        hist = hist / (jnp.sum(hist) * (edges[1:] - edges[:-1]))
    return hist, edges
