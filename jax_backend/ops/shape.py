"""Shape and view lowerings. Views become copies: the graph is functional, nothing aliases."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from jax_backend.ops._common import canon_dim, jax_dtype, numel, promote
from jax_backend.registry import lowers

aten = torch.ops.aten


def _resolve_shape(x, size):
    size = [int(s) for s in size]
    if -1 in size:
        known = numel([s for s in size if s != -1])
        size[size.index(-1)] = numel(x.shape) // known if known else 0
    return tuple(size)


@lowers(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def aten_view(x, size):
    return jnp.reshape(x, _resolve_shape(x, size))


@lowers(aten.permute.default, aten.permute_copy.default)
def aten_permute(x, dims):
    return jnp.transpose(x, [canon_dim(d, x.ndim) for d in dims])


@lowers(aten.t.default)
def aten_t(x):
    return x.T if x.ndim == 2 else x


@lowers(aten.transpose.int)
def aten_transpose(x, dim0, dim1):
    return jnp.swapaxes(x, canon_dim(dim0, x.ndim), canon_dim(dim1, x.ndim))


@lowers(aten.expand.default, aten.expand_copy.default)
def aten_expand(x, size, *, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else int(s) for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


@lowers(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def aten_unsqueeze(x, dim):
    return jnp.expand_dims(x, dim + x.ndim + 1 if dim < 0 else dim)


def _squeeze(x, dims):
    dims = tuple(d for d in (canon_dim(d, x.ndim) for d in dims) if x.ndim and x.shape[d] == 1)
    return jnp.squeeze(x, dims) if dims else x


@lowers(aten.squeeze.default, aten.squeeze_copy.default)
def aten_squeeze(x):
    return _squeeze(x, range(x.ndim))


@lowers(aten.squeeze.dim, aten.squeeze_copy.dim)
def aten_squeeze_dim(x, dim):
    return _squeeze(x, [dim])


@lowers(aten.squeeze.dims, aten.squeeze_copy.dims)
def aten_squeeze_dims(x, dim):
    return _squeeze(x, dim)


@lowers(aten.select.int, aten.select_copy.int)
def aten_select(x, dim, index):
    axis = canon_dim(dim, x.ndim)
    index = index + x.shape[axis] if index < 0 else index
    return lax.index_in_dim(x, index, axis, keepdims=False)


def _slice_bounds(length, start, end, step):
    start, end, _ = slice(start, end, step).indices(length)
    end = max(end, start)
    return start, end


@lowers(aten.slice.Tensor, aten.slice_copy.Tensor)
def aten_slice(x, dim=0, start=None, end=None, step=1):
    axis = canon_dim(dim, x.ndim)
    start, end = _slice_bounds(x.shape[axis], start, end, step)
    return lax.slice_in_dim(x, start, end, step, axis)


@lowers(aten.narrow.default)
def aten_narrow(x, dim, start, length):
    axis = canon_dim(dim, x.ndim)
    start = start + x.shape[axis] if start < 0 else start
    return lax.slice_in_dim(x, start, start + length, 1, axis)


@lowers(aten.cat.default)
def aten_cat(tensors, dim=0):
    # torch still accepts (and skips) 1-D empty tensors next to tensors of any rank.
    ranked = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not ranked:
        return promote(*tensors)[0] if len(tensors) == 1 else jnp.concatenate(promote(*tensors))
    tensors = promote(*ranked) if len(ranked) > 1 else ranked
    return jnp.concatenate(tensors, axis=canon_dim(dim, tensors[0].ndim))


@lowers(aten.stack.default)
def aten_stack(tensors, dim=0):
    tensors = promote(*tensors) if len(tensors) > 1 else tensors
    return jnp.stack(tensors, axis=dim + tensors[0].ndim + 1 if dim < 0 else dim)


@lowers(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def aten_split_with_sizes(x, split_sizes, dim=0):
    axis = canon_dim(dim, x.ndim)
    offsets = np.cumsum([0] + list(split_sizes))
    return [lax.slice_in_dim(x, int(a), int(b), 1, axis) for a, b in zip(offsets[:-1], offsets[1:])]


@lowers(aten.split.Tensor, aten.split_copy.Tensor)
def aten_split(x, split_size, dim=0):
    axis = canon_dim(dim, x.ndim)
    length = x.shape[axis]
    sizes = [min(split_size, length - i) for i in range(0, length, split_size)] or [0]
    return aten_split_with_sizes(x, sizes, axis)


@lowers(aten.unbind.int, aten.unbind_copy.int)
def aten_unbind(x, dim=0):
    axis = canon_dim(dim, x.ndim)
    return [lax.index_in_dim(x, i, axis, keepdims=False) for i in range(x.shape[axis])]


@lowers(aten.clone.default)
def aten_clone(x, *, memory_format=None):
    return x


@lowers(
    aten.alias.default,
    aten.detach.default,
    aten.lift_fresh_copy.default,
    aten.alias_copy.default,
    aten.detach_copy.default,
    aten.lift_fresh.default,
    aten.contiguous.default,
)
def aten_alias(x, *args, **kwargs):
    return x


@lowers(aten._to_copy.default)
def aten_to_copy(
    x,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    memory_format=None,
):
    return x if dtype is None else x.astype(jax_dtype(dtype))


@lowers(aten.copy.default)
def aten_copy(x, src, non_blocking=False):
    return jnp.broadcast_to(src.astype(x.dtype), x.shape)


@lowers(aten.flip.default)
def aten_flip(x, dims):
    return jnp.flip(x, [canon_dim(d, x.ndim) for d in dims]) if x.ndim else x


@lowers(aten.roll.default)
def aten_roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(canon_dim(d, x.ndim) for d in dims))


@lowers(aten.repeat.default)
def aten_repeat(x, repeats):
    lead = len(repeats) - x.ndim
    x = jnp.reshape(x, (1,) * lead + x.shape)
    return jnp.tile(x, tuple(repeats))


@lowers(aten.constant_pad_nd.default)
def aten_constant_pad_nd(x, pad, value=0):
    # pad lists (before, after) pairs starting from the last dim; negative pads crop.
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        axis = x.ndim - 1 - i
        config[axis] = (int(pad[2 * i]), int(pad[2 * i + 1]), 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), config)


@lowers(aten.diagonal.default, aten.diagonal_copy.default)
def aten_diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, canon_dim(dim1, x.ndim), canon_dim(dim2, x.ndim))


def _strided_indices(size, stride, storage_offset):
    index = np.asarray(storage_offset or 0, dtype=np.int64)
    for n, s in zip(size, stride):
        index = index[..., None] + np.arange(n, dtype=np.int64) * s
    return index.reshape(tuple(size))


@lowers(aten.as_strided.default, aten.as_strided_copy.default)
def aten_as_strided(x, size, stride, storage_offset=None):
    """Reads the input as its contiguous storage (inputs of a functional graph are contiguous)."""
    flat = x.reshape(-1)
    return flat[_strided_indices(size, stride, storage_offset)]


@lowers(aten.as_strided_scatter.default)
def aten_as_strided_scatter(x, src, size, stride, storage_offset=None):
    flat = x.reshape(-1)
    index = _strided_indices(size, stride, storage_offset)
    return flat.at[index].set(src.astype(x.dtype)).reshape(x.shape)


@lowers(aten.slice_scatter.default)
def aten_slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    axis = canon_dim(dim, x.ndim)
    start, end = _slice_bounds(x.shape[axis], start, end, step)
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, end, step)
    return x.at[tuple(index)].set(src.astype(x.dtype))


@lowers(aten.select_scatter.default)
def aten_select_scatter(x, src, dim, index):
    axis = canon_dim(dim, x.ndim)
    index = index + x.shape[axis] if index < 0 else index
    where = [slice(None)] * x.ndim
    where[axis] = index
    return x.at[tuple(where)].set(src.astype(x.dtype))


@lowers(aten.diagonal_scatter.default)
def aten_diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = canon_dim(dim1, x.ndim), canon_dim(dim2, x.ndim)
    n = src.shape[-1]
    rows = np.arange(n) + max(-offset, 0)
    cols = np.arange(n) + max(offset, 0)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    moved = moved.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@lowers(aten.unfold.default)
def aten_unfold(x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    axis = canon_dim(dimension, x.ndim)
    count = (x.shape[axis] - size) // step + 1
    starts = np.arange(count) * step
    windows = starts[:, None] + np.arange(size)[None, :]
    taken = jnp.take(x, windows, axis=axis)  # ..., count, size, ...
    return jnp.moveaxis(taken, axis + 1, -1)


@lowers(aten.tril.default)
def aten_tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowers(aten.triu.default)
def aten_triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


# ---------------------------------------------------------------------------- complex views
@lowers(aten.view_as_real.default, aten.view_as_real_copy.default)
def aten_view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lowers(aten.view_as_complex.default, aten.view_as_complex_copy.default)
def aten_view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])


@lowers(aten._conj.default, aten._conj_copy.default)
def aten_conj(x):
    """The lazy conjugate view, materialised (identity on real tensors)."""
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@lowers(aten.resolve_neg.default, aten.resolve_conj.default)
def aten_resolve_neg(x):
    """Lazy conj/neg views are materialised when taken (``_conj``, ``_neg_view``)."""
    return x


@lowers(aten.narrow_copy.default)
def aten_narrow_copy(x, dim, start, length):
    return aten_narrow(x, dim, start, length)


# - func: resize(Tensor self, SymInt[] size, *, MemoryFormat? memory_format=None) -> Tensor
@lowers(aten.resize.default)
def aten_resize(x, size, *, memory_format=None):
    """The functional resize: the first elements of the flat storage, zero-filled past its end
    (torch leaves that memory uninitialised)."""
    numel_out = numel(size)
    flat = x.reshape(-1)
    if numel_out <= flat.shape[0]:
        flat = flat[:numel_out]
    else:
        flat = jnp.concatenate([flat, jnp.zeros((numel_out - flat.shape[0],), x.dtype)])
    return flat.reshape(tuple(int(s) for s in size))
