"""Indexing, gather/scatter and embedding lowerings."""

from __future__ import annotations

import jax.numpy as jnp

import torch
from jax import lax

from jax_backend.ops._common import canon_dim
from jax_backend.registry import lowers

aten = torch.ops.aten


class DataDependentIndexError(NotImplementedError):
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
    return jnp.take(x, index.reshape(-1) if index.ndim else index.reshape(1), axis=canon_dim(dim, x.ndim))


@lowers(aten.embedding.default)
def aten_embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
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
    axis = canon_dim(dim, x.ndim)
    return x[_scatter_indices(index, axis)]


def _scatter(x, dim, index, src, mode):
    if x.ndim == 0:
        x, index = x.reshape(1), index.reshape(1)
        src = jnp.asarray(src, x.dtype).reshape(-1)[:1] if jnp.ndim(src) else src
        return _scatter(x, 0, index, src, mode).reshape(())
    axis = canon_dim(dim, x.ndim)
    if jnp.ndim(src):
        src = src[tuple(slice(0, n) for n in index.shape)]
    src = jnp.broadcast_to(jnp.asarray(src, x.dtype), index.shape)
    ref = x.at[_scatter_indices(index, axis)]
    return getattr(ref, mode)(src)


@lowers(aten.scatter.src, aten.scatter.value)
def aten_scatter(x, dim, index, src):
    return _scatter(x, dim, index, src, "set")


_SCATTER_REDUCE = {"add": "add", "sum": "add", "multiply": "multiply", "prod": "multiply",
                   "amax": "max", "amin": "min"}


@lowers(aten.scatter.reduce, aten.scatter.value_reduce)
def aten_scatter_reduce_legacy(x, dim, index, src, *, reduce):
    return _scatter(x, dim, index, src, _SCATTER_REDUCE[reduce])


@lowers(aten.scatter_add.default)
def aten_scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "add")


@lowers(aten.scatter_reduce.two)
def aten_scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    if x.ndim == 0:
        return aten_scatter_reduce(x.reshape(1), 0, index.reshape(1), src.reshape(1), reduce,
                                   include_self=include_self).reshape(())
    axis = canon_dim(dim, x.ndim)
    src = src[tuple(slice(0, n) for n in index.shape)].astype(x.dtype)
    coords = _scatter_indices(index, axis)
    touched = jnp.zeros(x.shape, jnp.bool_).at[coords].set(True)
    if reduce == "mean":
        total = x.at[coords].add(src) if include_self else jnp.zeros_like(x).at[coords].add(src)
        count = jnp.zeros(x.shape, x.dtype).at[coords].add(jnp.ones_like(src))
        count = count + 1 if include_self else count
        mean = total / jnp.maximum(count, 1) if jnp.issubdtype(x.dtype, jnp.inexact) else (
            jnp.floor_divide(total, jnp.maximum(count, 1)))
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
    mask = jnp.broadcast_to(mask, x.shape)
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


