"""Indexing, gather/scatter and embedding lowerings."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from jax_backend import native_embedding
from jax_backend.errors import CstorchError
from jax_backend.ops._common import canon_dim, compute_dtype
from jax_backend.registry import lowers

aten = torch.ops.aten


class DataDependentIndexError(CstorchError, NotImplementedError):
    """A boolean mask index whose result shape depends on tensor values."""


def _index_tuple(indices):
    for i in indices:
        if i is not None and i.dtype == jnp.bool_:
            raise DataDependentIndexError(
                "Indexing with a boolean mask gives a result whose shape depends on the mask's "
                "values, which a static graph cannot express. Use torch.where(mask, x, other) "
                "or multiply by the mask instead."
            )
    return tuple(slice(None) if i is None else i for i in indices)


@lowers(aten.index.Tensor)
def aten_index(x, indices):
    return x[_index_tuple(indices)]


def _single_leading_mask(x, indices):
    """index_put with one boolean mask over leading dims (``x[mask] = v``) becomes a where."""
    masks = [i for i in indices if i is not None]
    if len(masks) != 1 or masks[0].dtype != jnp.bool_ or indices[0] is None:
        return None
    mask = masks[0]
    return mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))


@lowers(aten.index_put.default, aten._unsafe_index_put.default)
def aten_index_put(x, indices, values, accumulate=False):
    values = values.astype(x.dtype)
    mask = _single_leading_mask(x, indices)
    if mask is not None:
        if values.size != 1:
            raise DataDependentIndexError(
                "index_put with a boolean mask and non-scalar values depends on the mask's "
                "values; use torch.where(mask, values, x) instead."
            )
        values = values.reshape(())
        return jnp.where(mask, x + values if accumulate else values, x)
    where = _index_tuple(indices)
    return x.at[where].add(values) if accumulate else x.at[where].set(values)


@lowers(aten.index_select.default)
def aten_index_select(x, dim, index):
    if x.ndim == 0:
        return x
    return jnp.take(
        x, index.reshape(-1) if index.ndim else index.reshape(1), axis=canon_dim(dim, x.ndim)
    )


@lowers(aten.embedding.default)
def aten_embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if weight.ndim >= 1 and native_embedding.applies(weight, indices):  # the engine's CPU program
        return native_embedding.forward(weight, indices)
    return jnp.take(weight, indices, axis=0)


def _scatter_indices(index, dim):
    """Full coordinate arrays for torch's scatter/gather along ``dim`` of an index tensor."""
    coords = []
    for d in range(index.ndim):
        coords.append(index if d == dim else lax.broadcasted_iota(jnp.int64, index.shape, d))
    return tuple(coords)


@lowers(aten.gather.default)
def aten_gather(x, dim, index, *, sparse_grad=False):
    if x.ndim == 0:
        return x[()] if index.ndim == 0 else jnp.broadcast_to(x, index.shape)
    if index.size == 0:  # torch skips the rank check for empty indices
        return jnp.zeros(index.shape, x.dtype)
    axis = canon_dim(dim, x.ndim)
    return x[_scatter_indices(index, axis)]


def _scatter(x, dim, index, src, mode):
    if x.ndim == 0:
        x, index = x.reshape(1), index.reshape(1)
        src = jnp.asarray(src, x.dtype).reshape(-1)[:1] if jnp.ndim(src) else src
        return _scatter(x, 0, index, src, mode).reshape(())
    if index.size == 0:
        return x
    axis = canon_dim(dim, x.ndim)
    if jnp.ndim(src):
        src = src[tuple(slice(0, n) for n in index.shape)]
    src = jnp.broadcast_to(jnp.asarray(src, x.dtype), index.shape)
    ref = x.at[_scatter_indices(index, axis)]
    return getattr(ref, mode)(src)


@lowers(aten.scatter.src, aten.scatter.value)
def aten_scatter(x, dim, index, src):
    return _scatter(x, dim, index, src, "set")


_SCATTER_REDUCE = {
    "add": "add",
    "sum": "add",
    "multiply": "multiply",
    "prod": "multiply",
    "amax": "max",
    "amin": "min",
}


@lowers(aten.scatter.reduce, aten.scatter.value_reduce)
def aten_scatter_reduce_legacy(x, dim, index, src, *, reduce):
    return _scatter(x, dim, index, src, _SCATTER_REDUCE[reduce])


@lowers(aten.scatter_add.default)
def aten_scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "add")


@lowers(aten.scatter_reduce.two)
def aten_scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    if x.ndim == 0:
        return aten_scatter_reduce(
            x.reshape(1), 0, index.reshape(1), src.reshape(1), reduce, include_self=include_self
        ).reshape(())
    axis = canon_dim(dim, x.ndim)
    src = src[tuple(slice(0, n) for n in index.shape)].astype(x.dtype)
    coords = _scatter_indices(index, axis)
    touched = jnp.zeros(x.shape, jnp.bool_).at[coords].set(True)
    if reduce == "mean":
        total = x.at[coords].add(src) if include_self else jnp.zeros_like(x).at[coords].add(src)
        count = jnp.zeros(x.shape, x.dtype).at[coords].add(jnp.ones_like(src))
        count = count + 1 if include_self else count
        mean = (
            total / jnp.maximum(count, 1)
            if jnp.issubdtype(x.dtype, jnp.inexact)
            else (jnp.floor_divide(total, jnp.maximum(count, 1)))
        )
        return jnp.where(touched, mean.astype(x.dtype), x)
    mode = _SCATTER_REDUCE[reduce]
    if include_self:
        return getattr(x.at[coords], mode)(src)
    identity = {"add": 0, "multiply": 1, "max": _lowest(x.dtype), "min": _highest(x.dtype)}[mode]
    base = jnp.full(x.shape, identity, x.dtype)
    return jnp.where(touched, getattr(base.at[coords], mode)(src), x)


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype).min


def _highest(dtype):
    return jnp.inf if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype).max


@lowers(aten.masked_scatter.default)
def aten_masked_scatter(x, mask, source):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x, mask = jnp.broadcast_to(x, shape), jnp.broadcast_to(mask, shape)
    position = jnp.cumsum(mask.reshape(-1).astype(jnp.int64)) - 1
    taken = source.reshape(-1)[jnp.clip(position, 0, max(source.size - 1, 0))]
    return jnp.where(mask, taken.reshape(x.shape).astype(x.dtype), x)


@lowers(aten.index_add.default)
def aten_index_add(x, dim, index, source, *, alpha=1):
    axis = canon_dim(dim, x.ndim)
    where = [slice(None)] * x.ndim
    where[axis] = index
    return x.at[tuple(where)].add(jnp.moveaxis(jnp.moveaxis(source, axis, 0), 0, axis) * alpha)


@lowers(aten.index_copy.default)
def aten_index_copy(x, dim, index, source):
    axis = canon_dim(dim, x.ndim)
    where = [slice(None)] * x.ndim
    where[axis] = index
    return x.at[tuple(where)].set(source.astype(x.dtype))


@lowers(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def aten_index_fill(x, dim, index, value):
    axis = canon_dim(dim, x.ndim)
    where = [slice(None)] * x.ndim
    where[axis] = index
    return x.at[tuple(where)].set(jnp.asarray(value, x.dtype))


@lowers(aten.take.default)
def aten_take(x, index):
    return x.reshape(-1)[index]


# - func: embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights,
#   SymInt padding_idx, bool scale_grad_by_freq) -> Tensor
@lowers(aten.embedding_dense_backward.default)
def aten_embedding_dense_backward(
    grad_output, indices, num_weights, padding_idx, scale_grad_by_freq
):
    """Summed in float32 for half gradients, then rounded (as torch's decomposition; its CPU
    kernel sums in the half type); an index outside [0, num_weights) adds nothing."""
    if not scale_grad_by_freq and native_embedding.applies(grad_output, indices):
        return native_embedding.backward(grad_output, indices, num_weights, padding_idx)
    flat = indices.reshape(-1)
    grad = grad_output.reshape(flat.shape + grad_output.shape[indices.ndim :])
    grad = grad.astype(compute_dtype(grad))
    valid = (flat >= 0) & (flat < num_weights)
    flat = jnp.where(valid, flat, 0)
    keep = (valid & (flat != padding_idx))[:, None]
    grad = jnp.where(keep, grad, jnp.zeros((), grad.dtype))
    if scale_grad_by_freq:
        counts = (
            jnp.zeros((num_weights,), grad.dtype)
            .at[flat]
            .add(valid.astype(grad.dtype), mode="promise_in_bounds")
        )
        grad = grad / jnp.maximum(counts[flat], 1)[:, None]
    summed = (
        jnp.zeros((num_weights,) + grad.shape[1:], grad.dtype)
        .at[flat]
        .add(grad, mode="promise_in_bounds")
    )
    return summed.astype(grad_output.dtype)


_BAG_SUM, _BAG_MEAN, _BAG_MAX = 0, 1, 2


def _bag_ids(indices, offsets, include_last_offset):
    """(bag id per index position, number of bags, in-range mask)."""
    num_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    positions = jnp.arange(indices.shape[0], dtype=offsets.dtype)
    bag = jnp.searchsorted(offsets[:num_bags], positions, side="right") - 1
    in_range = bag >= 0
    if include_last_offset:
        in_range = in_range & (positions < offsets[num_bags])
    return jnp.clip(bag, 0, max(num_bags - 1, 0)).astype(offsets.dtype), num_bags, in_range


def _embedding_bag(
    weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx
):
    bag, num_bags, member = _bag_ids(indices, offsets, include_last_offset)
    if padding_idx is not None and padding_idx >= 0:
        member = member & (indices != padding_idx)
    rows = jnp.take(weight, indices, axis=0)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    counts = jnp.zeros((num_bags,), offsets.dtype).at[bag].add(member.astype(offsets.dtype))
    if mode == _BAG_MAX:
        lowest = jnp.asarray(-jnp.inf, rows.dtype)
        masked = jnp.where(member[:, None], rows, lowest)
        out = jnp.full((num_bags, weight.shape[1]), lowest).at[bag].max(masked)
        # The first member index whose row attains the maximum, per feature.
        hit = member[:, None] & (masked == out[bag])
        big = jnp.iinfo(jnp.int64).max
        position = jnp.where(hit, jnp.arange(indices.shape[0])[:, None], big)
        first = jnp.full((num_bags, weight.shape[1]), big).at[bag].min(position)
        empty = (counts == 0)[:, None]
        max_indices = jnp.where(empty, 0, indices[jnp.clip(first, 0, indices.shape[0] - 1)])
        out = jnp.where(empty, jnp.zeros((), out.dtype), out)
        return out, max_indices.astype(offsets.dtype), counts, bag
    summed = (
        jnp.zeros((num_bags, weight.shape[1]), rows.dtype)
        .at[bag]
        .add(jnp.where(member[:, None], rows, jnp.zeros((), rows.dtype)))
    )
    if mode == _BAG_MEAN:
        summed = summed / jnp.maximum(counts, 1)[:, None].astype(summed.dtype)
    return summed, None, counts, bag


# - func: _embedding_bag(Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq=False,
#   int mode=0, bool sparse=False, Tensor? per_sample_weights=None, bool include_last_offset=False,
#   int padding_idx=-1) -> (Tensor, Tensor, Tensor, Tensor)
@lowers(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def aten_embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """offset2bag, bag_size and max_indices follow torch's shapes; only ``output`` (and
    ``max_indices`` in max mode) carry torch's values, the rest feed our own backward."""
    out, max_indices, counts, bag = _embedding_bag(
        weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx
    )
    fast_sum = mode == _BAG_SUM and weight.dtype in (jnp.float32, jnp.float16) and padding_idx < 0
    offset2bag = jnp.zeros((0,), offsets.dtype) if fast_sum else bag
    if max_indices is None:
        max_indices = jnp.zeros(counts.shape, offsets.dtype)
    return out, offset2bag, counts, max_indices


# - func: _embedding_bag_backward(Tensor grad, Tensor indices, Tensor offsets, Tensor offset2bag,
#   Tensor bag_size, Tensor maximum_indices, SymInt num_weights, bool scale_grad_by_freq, int mode,
#   bool sparse, Tensor? per_sample_weights, int padding_idx=-1) -> Tensor
@lowers(aten._embedding_bag_backward.default)
def aten_embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    include_last_offset = offsets.shape[0] == grad.shape[0] + 1
    features = grad.shape[1]
    if mode == _BAG_MAX:
        nonempty = (bag_size > 0)[:, None]
        cols = jnp.broadcast_to(jnp.arange(features), maximum_indices.shape)
        g = jnp.where(nonempty, grad, jnp.zeros((), grad.dtype))
        return jnp.zeros((num_weights, features), grad.dtype).at[maximum_indices, cols].add(g)
    bag, _, member = _bag_ids(indices, offsets, include_last_offset)
    if padding_idx is not None and padding_idx >= 0:
        member = member & (indices != padding_idx)
    rows = grad[bag]
    if mode == _BAG_MEAN:
        rows = rows / jnp.maximum(bag_size[bag], 1)[:, None].astype(rows.dtype)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[indices].add(member.astype(grad.dtype))
        rows = rows / jnp.maximum(counts[indices], 1)[:, None]
    rows = jnp.where(member[:, None], rows, jnp.zeros((), rows.dtype))
    return jnp.zeros((num_weights, features), grad.dtype).at[indices].add(rows)


# - func: _embedding_bag_per_sample_weights_backward(Tensor grad, Tensor weight, Tensor indices,
#   Tensor offsets, Tensor offset2bag, int mode, int padding_idx=-1) -> Tensor
@lowers(aten._embedding_bag_per_sample_weights_backward.default)
def aten_embedding_bag_per_sample_weights_backward(
    grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1
):
    include_last_offset = offsets.shape[0] == grad.shape[0] + 1
    bag, _, member = _bag_ids(indices, offsets, include_last_offset)
    if padding_idx is not None and padding_idx >= 0:
        member = member & (indices != padding_idx)
    dots = jnp.sum(grad[bag] * jnp.take(weight, indices, axis=0), axis=-1)
    return jnp.where(member, dots, jnp.zeros((), dots.dtype))


# - func: index_reduce(Tensor self, int dim, Tensor index, Tensor source, str reduce, *,
#   bool include_self=True) -> Tensor
@lowers(aten.index_reduce.default)
def aten_index_reduce(x, dim, index, source, reduce, *, include_self=True):
    axis = canon_dim(dim, x.ndim)
    moved = jnp.moveaxis(x, axis, 0) if x.ndim else x.reshape(1)
    src = jnp.moveaxis(source, axis, 0) if source.ndim else source.reshape(1)
    index = index.reshape(-1)
    src = src.astype(x.dtype)
    touched = jnp.zeros(moved.shape[:1], jnp.bool_).at[index].set(True)
    touched = touched.reshape((-1,) + (1,) * (moved.ndim - 1))
    if reduce == "mean":
        base = moved if include_self else jnp.zeros_like(moved)
        total = base.at[index].add(src)
        count = jnp.zeros(moved.shape[:1], x.dtype).at[index].add(1)
        count = (count + 1 if include_self else count).reshape(touched.shape)
        count = jnp.maximum(count, 1)
        mean = (
            total / count
            if jnp.issubdtype(x.dtype, jnp.inexact)
            else jnp.floor_divide(total, count)
        )
        out = jnp.where(touched, mean.astype(x.dtype), moved)
    else:
        mode = {"prod": "multiply", "amax": "max", "amin": "min"}[reduce]
        if include_self:
            out = getattr(moved.at[index], mode)(src)
        else:
            identity = {"multiply": 1, "max": _lowest(x.dtype), "min": _highest(x.dtype)}[mode]
            base = jnp.full(moved.shape, identity, x.dtype)
            out = jnp.where(touched, getattr(base.at[index], mode)(src), moved)
    return jnp.moveaxis(out, 0, axis) if x.ndim else out.reshape(())


@lowers(aten.put.default)
def aten_put(x, index, source, accumulate=False):
    flat = x.reshape(-1)
    index = index.reshape(-1)
    index = jnp.where(index < 0, index + flat.shape[0], index)
    values = source.reshape(-1).astype(x.dtype)
    ref = flat.at[index]
    return (ref.add(values) if accumulate else ref.set(values)).reshape(x.shape)


# - func: masked_scatter_backward(Tensor grad_output, Tensor mask, SymInt[] sizes) -> Tensor
@lowers(aten.masked_scatter_backward.default)
def aten_masked_scatter_backward(grad_output, mask, sizes):
    mask = jnp.broadcast_to(mask, grad_output.shape).reshape(-1)
    numel = 1
    for s in sizes:
        numel *= int(s)
    position = jnp.cumsum(mask.astype(jnp.int64)) - 1
    # Positions past the source's size are dropped (mode="drop"), like torch's masked_select.
    target = jnp.where(mask, position, numel)
    grad = (
        jnp.zeros((numel,), grad_output.dtype).at[target].add(grad_output.reshape(-1), mode="drop")
    )
    return grad.reshape(tuple(sizes))


# - func: nonzero_static(Tensor self, *, SymInt size, int fill_value=-1) -> Tensor
@lowers(aten.nonzero_static.default)
def aten_nonzero_static(x, *, size, fill_value=-1):
    """The static-size nonzero: the first ``size`` coordinates, padded with fill_value."""
    if x.ndim == 0:
        x = x.reshape(1)
        coords = jnp.nonzero(x, size=size, fill_value=fill_value)
        return jnp.zeros((size, 0), jnp.int64)
    coords = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(coords, axis=-1).astype(jnp.int64)
