"""Pooling lowerings: max, average, adaptive and fractional pooling in 1-3 dimensions, with
their backward ops as ``jax.vjp`` of the forward lowering (one definition for both).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from jax_backend.ops._common import compute_dtype, ntuple
from jax_backend.registry import lowers

aten = torch.ops.aten


# ----------------------------------------------------------------------------------- pooling
def _pool_geometry(in_size, kernel, stride, padding, dilation, ceil_mode):
    """Output length and the extra right padding that ceil_mode needs (torch's formula)."""
    effective = dilation * (kernel - 1) + 1
    numerator = in_size + 2 * padding - effective
    out = (-(-numerator // stride) if ceil_mode else numerator // stride) + 1
    if ceil_mode and (out - 1) * stride >= in_size + padding:
        out -= 1
    extra = max((out - 1) * stride + effective - (in_size + 2 * padding), 0)
    return out, extra


def _pool_windows(x, kernel, stride, padding, dilation, ceil_mode, pad_value):
    """Every kernel offset's strided view of the padded input (K views of shape (N, C, *out),
    in ``np.ndindex(*kernel)`` order), their offsets, and the output's spatial shape."""
    nd = len(kernel)
    spatial = x.shape[-nd:]
    geoms = [
        _pool_geometry(s, k, st, p, d, ceil_mode)
        for s, k, st, p, d in zip(spatial, kernel, stride, padding, dilation)
    ]
    config = [(0, 0, 0)] * (x.ndim - nd) + [
        (p, p + extra, 0) for p, (_, extra) in zip(padding, geoms)
    ]
    padded = lax.pad(x, jnp.asarray(pad_value, x.dtype), config)
    outs = [g[0] for g in geoms]
    windows, offsets = [], []
    for offset in np.ndindex(*kernel):
        starts = [o * d for o, d in zip(offset, dilation)]
        limits = [s + (n - 1) * st + 1 for s, n, st in zip(starts, outs, stride)]
        view = lax.slice(
            padded,
            (0,) * (x.ndim - nd) + tuple(starts),
            padded.shape[: x.ndim - nd] + tuple(limits),
            (1,) * (x.ndim - nd) + tuple(stride),
        )
        windows.append(view)
        offsets.append(starts)
    return windows, offsets, outs


def _pool_args(x, kernel_size, stride, padding, dilation, nd):
    kernel = ntuple(kernel_size, nd)
    stride = ntuple(stride, nd) if stride else kernel
    return kernel, stride, ntuple(padding, nd), ntuple(dilation, nd)


def _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, nd):
    """(max, flat index of the max in the input's spatial plane) of every window, as torch's
    CPU kernel picks it: the kernel's offsets scanned in order from the window's first
    position inside the input, an offset taken where ``val > max || isnan(val)`` (the first
    of tied maxima, the last NaN). Each offset is a strided view of the input and the scan one
    elementwise pass XLA fuses, with no copy of the K views stacked (on pytorch/examples'
    MNIST network the stacked form materialized a float32 (4, ...) array: ~8 ms of a ~40 ms
    bf16 CPU step)."""
    kernel, stride, padding, dilation = _pool_args(x, kernel_size, stride, padding, dilation, nd)
    inexact = jnp.issubdtype(x.dtype, jnp.inexact)
    lowest = -jnp.inf if inexact else jnp.iinfo(x.dtype).min
    windows, offsets, outs = _pool_windows(x, kernel, stride, padding, dilation, ceil_mode, lowest)
    spatial = x.shape[-nd:]
    # The scan keeps each window's chosen offset as its flat distance in the input's plane,
    # in int32 where the plane allows: the index is then that plus the window's start, with
    # no integer division (XLA's CPU code divides int64 element by element).
    # (int32 must hold every window's start and offsets, padding and ceil_mode's beyond.)
    index_dtype = _index_dtype(
        [
            n + 2 * p + d * (k - 1) + st
            for n, p, d, k, st in zip(spatial, padding, dilation, kernel, stride)
        ]
    )
    strides = _plane_strides(spatial)
    # Where each offset falls inside the input, per output position (None: everywhere).
    inside = [_inside(offset, outs, spatial, stride, padding) for offset in offsets]

    def distance(offset):
        return index_dtype(sum(o * s for o, s in zip(offset, strides)))

    values, found = windows[0], inside[0]
    choice = jnp.full(values.shape, distance(offsets[0]), index_dtype)
    for window, offset, inside_k in zip(windows[1:], offsets[1:], inside[1:]):
        take = window > values
        if inexact:
            take = take | jnp.isnan(window)
        if found is not None:  # torch starts from the window's first position in the input
            take = take | ~found
        if inside_k is None:  # this offset is inside everywhere: every window has begun
            found = None
        else:
            take = take & inside_k
            found = None if found is None else found | inside_k
        values = jnp.where(take, window, values)
        choice = jnp.where(take, distance(offset), choice)
    # Flat index into the unpadded spatial plane: the window's first (padded) position plus
    # the chosen offset's distance.
    start = _window_starts(choice.shape, stride, padding, strides, index_dtype)
    return values, (start + choice).astype(jnp.int64)


def _index_dtype(extents):
    """int32 for flat indices into a plane of ``extents`` that int32 can number, else int64."""
    return jnp.int32 if int(np.prod(extents)) < 2**31 else jnp.int64


def _window_starts(shape, stride, padding, strides, dtype):
    """The flat index in the input's plane (row-major ``strides``) of each window's first
    position, padding counted (negative inside it): an array of ``shape``, (..., *outs)."""
    nd = len(stride)
    return sum(
        (lax.broadcasted_iota(dtype, shape, len(shape) - nd + axis) * stride[axis] - padding[axis])
        * strides[axis]
        for axis in range(nd)
    )


def _plane_strides(spatial):
    """Each spatial axis's step in a flat index of the plane (row-major)."""
    return [int(np.prod(spatial[axis + 1 :])) for axis in range(len(spatial))]


def _inside(offset, outs, spatial, stride, padding):
    """Whether a kernel offset's element lies in the input (not the padding) at each output
    position: a boolean array over the output's spatial dims, or None where it always does."""
    masks = []
    for o, n, size, st, p in zip(offset, outs, spatial, stride, padding):
        coordinate = np.arange(n) * st - p + o
        masks.append((coordinate >= 0) & (coordinate < size))
    if all(m.all() for m in masks):
        return None
    grid = masks[0]
    for m in masks[1:]:
        grid = grid[..., None] & m
    return jnp.asarray(grid)


def _windowed_max_pool_backward(
    grad_output, x, indices, nd, kernel_size, stride, padding, dilation
):
    """max_pool's input gradient: without a scatter where the windows tile the input."""
    kernel, stride, padding, dilation = _pool_args(x, kernel_size, stride, padding, dilation, nd)
    if stride == kernel and not any(padding) and all(d == 1 for d in dilation):
        return _tiled_max_pool_backward(grad_output, x, indices, kernel)
    return _max_pool_backward(grad_output, x, indices, nd)


def _max_pool_backward(grad_output, x, indices, nd):
    """The input's gradient: each output's gradient added at the input its index names
    (torch's ``grad_input[index] += grad_output``)."""
    lead = x.shape[:-nd]
    plane = int(np.prod(x.shape[-nd:]))
    grad = jnp.zeros(lead + (plane,), grad_output.dtype)
    g = grad_output.reshape(lead + (-1,))
    idx = indices.reshape(lead + (-1,))
    lead_index = tuple(lax.broadcasted_iota(jnp.int64, idx.shape, d) for d in range(len(lead)))
    return grad.at[lead_index + (idx,)].add(g).reshape(x.shape)


def _tiled_max_pool_backward(grad_output, x, indices, kernel):
    """``_max_pool_backward`` where the windows tile the input (stride = kernel, no padding or
    dilation: each input in one window at most, a remainder in none), without a scatter: each
    output's gradient goes to the window position its index names (max_pool's indices, each
    inside its own window), zero elsewhere; ceil_mode's partial windows are cropped to the
    input. The same numbers as the scatter-add onto zeros, -0.0 gradients included (stored
    as +0.0, as ``0.0 + -0.0`` gives). On pytorch/examples' MNIST network the scatter and its
    index arrays took ~5 ms of a ~100 ms profiled CPU step."""
    nd = len(kernel)
    spatial, outs = x.shape[-nd:], grad_output.shape[-nd:]
    lead = grad_output.shape[:-nd]
    # The tiled shape interleaves each output axis with its kernel axis: (*lead, o1, k1, ...).
    tiled = lead + tuple(n for pair in zip(outs, kernel) for n in pair)
    expanded = lead + tuple(n for o in outs for n in (o, 1))
    # Each index less its window's first position is the chosen element's flat distance
    # within the window; compared with each window position's, with no integer division.
    index_dtype = _index_dtype([n + k for n, k in zip(spatial, kernel)])  # partial windows too
    strides = _plane_strides(spatial)
    start = _window_starts(indices.shape, kernel, (0,) * nd, strides, index_dtype)
    chosen_distance = (indices.astype(index_dtype) - start).reshape(expanded)
    distance = sum(
        lax.broadcasted_iota(index_dtype, tiled, len(lead) + 2 * axis + 1) * strides[axis]
        for axis in range(nd)
    )
    chosen = (grad_output != 0).reshape(expanded)  # a zero (either sign) lands as +0.0
    chosen = chosen & (chosen_distance == distance)
    zero = jnp.zeros((), grad_output.dtype)
    grad = jnp.where(chosen, grad_output.reshape(expanded), zero)
    grad = grad.reshape(lead + tuple(o * k for o, k in zip(outs, kernel)))
    remainder = [(0, s - o * k, 0) for s, o, k in zip(spatial, outs, kernel)]  # < 0: crops
    return lax.pad(grad, zero, [(0, 0, 0)] * len(lead) + remainder)


@lowers(aten.max_pool2d_with_indices.default)
def aten_max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, 2)


@lowers(aten.max_pool3d_with_indices.default)
def aten_max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, 3)


@lowers(aten.max_pool2d_with_indices_backward.default)
def aten_max_pool2d_backward(
    grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _windowed_max_pool_backward(
        grad_output, x, indices, 2, kernel_size, stride, padding, dilation
    )


@lowers(aten.max_pool3d_with_indices_backward.default)
def aten_max_pool3d_backward(
    grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _windowed_max_pool_backward(
        grad_output, x, indices, 3, kernel_size, stride, padding, dilation
    )


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, nd):
    kernel, stride, padding, dilation = _pool_args(x, kernel_size, stride, padding, 1, nd)
    windows, _, outs = _pool_windows(x, kernel, stride, padding, dilation, ceil_mode, 0)
    total = jnp.sum(jnp.stack(windows).astype(compute_dtype(x)), axis=0)
    if divisor_override:
        return (total / divisor_override).astype(x.dtype)
    # torch's divisor: the window clipped to input+padding (count_include_pad) or to the input.
    counts = np.ones((), np.float64)
    for axis in range(nd):
        n_in, k, s, p = x.shape[x.ndim - nd + axis], kernel[axis], stride[axis], padding[axis]
        start = np.arange(outs[axis]) * s - p
        end = np.minimum(start + k, n_in + p)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, n_in)
        counts = counts[..., None] * (end - start)
    return (total / jnp.asarray(counts, total.dtype)).astype(x.dtype)


@lowers(aten.avg_pool2d.default)
def aten_avg_pool2d(
    x,
    kernel_size,
    stride=(),
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
):
    return _avg_pool(
        x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2
    )


@lowers(aten.avg_pool3d.default)
def aten_avg_pool3d(
    x,
    kernel_size,
    stride=(),
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
):
    return _avg_pool(
        x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3
    )


@lowers(aten.avg_pool2d_backward.default)
def aten_avg_pool2d_backward(
    grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    _, vjp = jax.vjp(
        lambda x_: _avg_pool(
            x_, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2
        ),
        x,
    )
    return vjp(grad_output)[0]


@lowers(aten.avg_pool3d_backward.default)
def aten_avg_pool3d_backward(
    grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    _, vjp = jax.vjp(
        lambda x_: _avg_pool(
            x_, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3
        ),
        x,
    )
    return vjp(grad_output)[0]


def _adaptive_matrix(in_size, out_size):
    """Row i averages input[floor(i*in/out) : ceil((i+1)*in/out)], torch's adaptive windows."""
    matrix = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        start = (i * in_size) // out_size
        end = -(-((i + 1) * in_size) // out_size)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


def _adaptive_avg_pool(x, output_size, nd):
    output_size = ntuple(output_size, nd)
    out = x.astype(compute_dtype(x))
    for axis, size in enumerate(output_size):
        dim = x.ndim - nd + axis
        m = jnp.asarray(_adaptive_matrix(x.shape[dim], size), out.dtype)
        out = jnp.moveaxis(
            jnp.tensordot(out, m, axes=([dim], [1]), precision=lax.Precision.HIGHEST), -1, dim
        )
    return out.astype(x.dtype)


@lowers(aten._adaptive_avg_pool2d.default)
def aten_adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg_pool(x, output_size, 2)


@lowers(aten._adaptive_avg_pool3d.default)
def aten_adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg_pool(x, output_size, 3)


@lowers(aten._adaptive_avg_pool2d_backward.default)
def aten_adaptive_avg_pool2d_backward(grad_output, x):
    size = grad_output.shape[-2:]
    _, vjp = jax.vjp(lambda x_: _adaptive_avg_pool(x_, size, 2), x)
    return vjp(grad_output)[0]


@lowers(aten._adaptive_avg_pool3d_backward.default)
def aten_adaptive_avg_pool3d_backward(grad_output, x):
    size = grad_output.shape[-3:]
    _, vjp = jax.vjp(lambda x_: _adaptive_avg_pool(x_, size, 3), x)
    return vjp(grad_output)[0]


@lowers(aten.adaptive_max_pool2d.default)
def aten_adaptive_max_pool2d(x, output_size):
    output_size = ntuple(output_size, 2)
    h, w = x.shape[-2:]
    values, indices = [], []
    for i in range(output_size[0]):
        h0, h1 = (i * h) // output_size[0], -(-((i + 1) * h) // output_size[0])
        row_v, row_i = [], []
        for j in range(output_size[1]):
            w0, w1 = (j * w) // output_size[1], -(-((j + 1) * w) // output_size[1])
            window = x[..., h0:h1, w0:w1].reshape(x.shape[:-2] + (-1,))
            k = jnp.argmax(window, axis=-1)
            row_v.append(jnp.max(window, axis=-1))
            row_i.append((h0 + k // (w1 - w0)) * w + w0 + k % (w1 - w0))
        values.append(jnp.stack(row_v, -1))
        indices.append(jnp.stack(row_i, -1))
    return jnp.stack(values, -2), jnp.stack(indices, -2).astype(jnp.int64)


@lowers(aten.adaptive_max_pool2d_backward.default)
def aten_adaptive_max_pool2d_backward(grad_output, x, indices):
    return _max_pool_backward(grad_output, x, indices, 2)


@lowers(aten.avg_pool1d.default)
def aten_avg_pool1d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1)


@lowers(aten.adaptive_avg_pool1d.default)
def aten_adaptive_avg_pool1d(x, output_size):
    return _adaptive_avg_pool(x, output_size, 1)


# -------------------------------------------------------------------- adaptive max pooling
def _adaptive_max_pool(x, output_size, nd):
    output_size = ntuple(output_size, nd)
    spatial = x.shape[-nd:]
    bounds = [
        [((i * n) // o, -(-((i + 1) * n) // o)) for i in range(o)]
        for n, o in zip(spatial, output_size)
    ]
    values, indices = [], []
    for cell in np.ndindex(*output_size):
        window = x[(Ellipsis,) + tuple(slice(*bounds[a][c]) for a, c in enumerate(cell))]
        wshape = window.shape[-nd:]
        flat = window.reshape(x.shape[:-nd] + (-1,))
        if jnp.issubdtype(x.dtype, jnp.inexact):  # NaN wins, as in torch
            k = jnp.argmax(
                jnp.where(
                    jnp.any(jnp.isnan(flat), -1, keepdims=True),
                    jnp.isnan(flat),
                    flat == jnp.max(flat, -1, keepdims=True),
                ),
                -1,
            )
        else:
            k = jnp.argmax(flat, axis=-1)
        values.append(jnp.take_along_axis(flat, k[..., None], -1)[..., 0])
        index = jnp.zeros(k.shape, jnp.int64)
        rest = k
        coords = []
        for a in reversed(range(nd)):
            coords.append(rest % wshape[a] + bounds[a][cell[a]][0])
            rest = rest // wshape[a]
        for a, coord in enumerate(reversed(coords)):
            index = index * spatial[a] + coord
        indices.append(index)
    shape = x.shape[:-nd] + tuple(output_size)
    return (
        jnp.stack(values, -1).reshape(shape),
        jnp.stack(indices, -1).reshape(shape).astype(jnp.int64),
    )


@lowers(aten.adaptive_max_pool3d.default)
def aten_adaptive_max_pool3d(x, output_size):
    return _adaptive_max_pool(x, output_size, 3)


@lowers(aten.adaptive_max_pool3d_backward.default)
def aten_adaptive_max_pool3d_backward(grad_output, x, indices):
    return _max_pool_backward(grad_output, x, indices, 3)


# ---------------------------------------------------------------------- fractional max pooling
def _fractional_starts(samples, in_size, out_size, kernel):
    """ATen's generate_intervals: start offsets (.., out) from per-plane samples (..,)."""
    if out_size == 1:
        return jnp.full(samples.shape + (1,), in_size - kernel, jnp.int64)
    alpha = (in_size - kernel) / (out_size - 1)
    i = jnp.arange(out_size - 1, dtype=samples.dtype)
    starts = jnp.floor((i + samples[..., None]) * alpha) - jnp.floor(samples[..., None] * alpha)
    starts = starts.astype(jnp.int64)
    last = jnp.full(samples.shape + (1,), in_size - kernel, jnp.int64)
    return jnp.concatenate([starts, last], axis=-1)


def _fractional_max_pool(x, kernel_size, output_size, samples, nd):
    kernel = ntuple(kernel_size, nd)
    output_size = ntuple(output_size, nd)
    unbatched = x.ndim == nd + 1
    if unbatched:
        x, samples = x[None], samples
    spatial = x.shape[-nd:]
    # samples: (N, C, nd), the last entry is the first spatial dim's... ATen uses [.., 0] for
    # width and [.., 1] for height (2-D); [.., 0] time? see below.
    samples = samples.astype(x.dtype)
    starts = []
    for a in range(nd):
        sample = samples[..., nd - 1 - a]
        starts.append(_fractional_starts(sample, spatial[a], output_size[a], kernel[a]))
    # Gather every kernel offset and take the max (first max wins, NaN wins).
    best_v, best_i = None, None
    for offset in np.ndindex(*kernel):
        coords = []
        for a in range(nd):
            c = starts[a] + offset[a]  # (N, C, out_a)
            shape = c.shape[:2] + tuple(output_size[b] if b == a else 1 for b in range(nd))
            coords.append(c.reshape(shape))
        flat_index = jnp.zeros(x.shape[:2] + tuple(output_size), jnp.int64)
        for a in range(nd):
            flat_index = flat_index * spatial[a] + coords[a]
        plane = x.reshape(x.shape[:2] + (-1,))
        v = jnp.take_along_axis(plane, flat_index.reshape(x.shape[:2] + (-1,)), -1).reshape(
            flat_index.shape
        )
        if best_v is None:
            best_v, best_i = v, flat_index
        else:
            better = (
                (v > best_v) | (jnp.isnan(v) & ~jnp.isnan(best_v))
                if jnp.issubdtype(x.dtype, jnp.inexact)
                else v > best_v
            )
            best_v = jnp.where(better, v, best_v)
            best_i = jnp.where(better, flat_index, best_i)
    if unbatched:
        best_v, best_i = best_v[0], best_i[0]
    return best_v, best_i


@lowers(aten.fractional_max_pool2d.default)
def aten_fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 2)


@lowers(aten.fractional_max_pool3d.default)
def aten_fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 3)


@lowers(aten.fractional_max_pool2d_backward.default)
def aten_fractional_max_pool2d_backward(grad_output, x, kernel_size, output_size, indices):
    return _max_pool_backward(grad_output, x, indices, 2)


@lowers(aten.fractional_max_pool3d_backward.default)
def aten_fractional_max_pool3d_backward(grad_output, x, kernel_size, output_size, indices):
    return _max_pool_backward(grad_output, x, indices, 3)
