"""Neural-network lowerings: convolution, normalisation, pooling, upsampling, attention.

Backward ops that torch does not decompose (convolution_backward, pooling backward, the CPU
flash-attention backward) are lowered as ``jax.vjp`` of the forward lowering, so forward and
backward share one definition.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from jax_backend.ops._common import accumulation_dtype, dot_precision, promote
from jax_backend.registry import lowers

aten = torch.ops.aten


def _tuple(value, n):
    if isinstance(value, (list, tuple)):
        value = list(value)
        return tuple(value * n) if len(value) == 1 else tuple(value)
    return (value,) * n


def _compute_dtype(x):
    """Normalisation statistics of half-precision inputs are computed in float32."""
    return jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else x.dtype


# ------------------------------------------------------------------------------- convolution
def _conv_forward(x, weight, stride, padding, dilation, transposed, output_padding, groups):
    nd = weight.ndim - 2
    x, weight = promote(x, weight)
    spatial = "DHW"[-nd:] if nd <= 3 else None
    dimension_numbers = ("NC" + spatial, "OI" + spatial, "NC" + spatial)
    stride, padding, dilation = _tuple(stride, nd), _tuple(padding, nd), _tuple(dilation, nd)
    options = dict(precision=dot_precision(x, weight),
                   preferred_element_type=accumulation_dtype(x.dtype))
    if not transposed:
        out = lax.conv_general_dilated(
            x, weight, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=dimension_numbers,
            feature_group_count=groups, **options)
        return out.astype(x.dtype)
    # A transposed convolution is the input-gradient of a convolution: dilate the input by the
    # stride, pad by dilation*(k-1)-p, and convolve with the flipped, in/out-swapped kernel.
    output_padding = _tuple(output_padding, nd)
    c_in, c_out_per_group = weight.shape[0], weight.shape[1]
    kernel = weight.reshape((groups, c_in // groups, c_out_per_group) + weight.shape[2:])
    kernel = jnp.swapaxes(kernel, 1, 2).reshape((groups * c_out_per_group, c_in // groups)
                                                + weight.shape[2:])
    kernel = jnp.flip(kernel, axis=tuple(range(2, 2 + nd)))
    pads = []
    for k, p, d, op in zip(weight.shape[2:], padding, dilation, output_padding):
        edge = d * (k - 1) - p
        pads.append((edge, edge + op))
    out = lax.conv_general_dilated(
        x, kernel, window_strides=(1,) * nd, padding=pads, lhs_dilation=stride,
        rhs_dilation=dilation, dimension_numbers=dimension_numbers,
        feature_group_count=groups, **options)
    return out.astype(x.dtype)


@lowers(aten.convolution.default)
def aten_convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding,
                     groups):
    unbatched = x.ndim == weight.ndim - 1
    if unbatched:
        x = x[None]
    out = _conv_forward(x, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * (out.ndim - 2))
    return out[0] if unbatched else out


@lowers(aten.convolution_backward.default)
def aten_convolution_backward(grad_output, x, weight, bias_sizes, stride, padding, dilation,
                              transposed, output_padding, groups, output_mask):
    def forward(x_, w_):
        return _conv_forward(x_, w_, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(forward, x, weight)
    grad_x, grad_w = vjp(grad_output.astype(x.dtype))
    grad_b = None
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad_output.ndim))
        grad_b = jnp.sum(grad_output, axis=axes)
    return (grad_x if output_mask[0] else None, grad_w if output_mask[1] else None, grad_b)


# ----------------------------------------------------------------------------- normalisation
@lowers(aten.native_layer_norm.default)
def aten_native_layer_norm(x, normalized_shape, weight, bias, eps):
    axis = x.ndim - len(normalized_shape)
    axes = tuple(range(axis, x.ndim))
    xc = x.astype(_compute_dtype(x))
    mean = jnp.mean(xc, axis=axes, keepdims=True)
    centered = xc - mean
    var = jnp.mean(centered * centered, axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = centered * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.astype(x.dtype), mean, rstd


@lowers(aten.native_group_norm.default)
def aten_native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    xc = x.astype(_compute_dtype(x)).reshape(n, group, (c // group) * hxw)
    mean = jnp.mean(xc, axis=-1, keepdims=True)
    centered = xc - mean
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (centered * rstd).reshape(x.shape)
    channel_shape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(channel_shape)
    if bias is not None:
        out = out + bias.reshape(channel_shape)
    return out.astype(x.dtype), mean.reshape(n, group), rstd.reshape(n, group)


def _channel_shape(x):
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _batch_norm_train(x, weight, bias, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    xc = x.astype(_compute_dtype(x))
    mean = jnp.mean(xc, axis=axes)
    centered = xc - mean.reshape(_channel_shape(x))
    var = jnp.mean(centered * centered, axis=axes)
    rstd = lax.rsqrt(var + eps)
    out = centered * rstd.reshape(_channel_shape(x))
    out = _affine(out, weight, bias)
    return out.astype(x.dtype), mean, rstd, var


def _affine(out, weight, bias):
    if weight is not None:
        out = out * weight.reshape(_channel_shape(out))
    if bias is not None:
        out = out + bias.reshape(_channel_shape(out))
    return out


def _batch_norm_eval(x, weight, bias, running_mean, running_var, eps):
    xc = x.astype(_compute_dtype(x))
    rstd = lax.rsqrt(running_var.astype(xc.dtype) + eps)
    out = (xc - running_mean.reshape(_channel_shape(x))) * rstd.reshape(_channel_shape(x))
    return _affine(out, weight, bias).astype(x.dtype)


def _updated_running_stats(x, mean, var, running_mean, running_var, momentum):
    n = x.size // x.shape[1]
    unbiased = var * (n / max(n - 1, 1))
    new_mean = (1 - momentum) * running_mean + momentum * mean.astype(running_mean.dtype)
    new_var = (1 - momentum) * running_var + momentum * unbiased.astype(running_var.dtype)
    return new_mean, new_var


@lowers(aten._native_batch_norm_legit_functional.default)
def aten_batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum,
                               eps):
    if not training:
        out = _batch_norm_eval(x, weight, bias, running_mean, running_var, eps)
        empty = jnp.zeros((0,), x.dtype)
        return out, empty, empty, running_mean, running_var
    out, mean, rstd, var = _batch_norm_train(x, weight, bias, eps)
    new_mean, new_var = _updated_running_stats(x, mean, var, running_mean, running_var, momentum)
    return out, mean, rstd, new_mean, new_var


@lowers(aten.native_batch_norm.default)
def aten_native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training or running_mean is None:
        out, mean, rstd, _ = _batch_norm_train(x, weight, bias, eps)
        return out, mean, rstd
    out = _batch_norm_eval(x, weight, bias, running_mean, running_var, eps)
    empty = jnp.zeros((0,), x.dtype)
    return out, empty, empty


@lowers(aten._native_batch_norm_legit.no_stats)
def aten_batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    out, mean, rstd, _ = _batch_norm_train(x, weight, bias, eps)
    return out, mean, rstd


@lowers(aten._native_batch_norm_legit_no_training.default)
def aten_batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    out = _batch_norm_eval(x, weight, bias, running_mean, running_var, eps)
    empty = jnp.zeros((0,), x.dtype)
    return out, empty, empty


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
    """Every kernel offset's strided view of the padded input: shape (K, N, C, *out)."""
    nd = len(kernel)
    spatial = x.shape[-nd:]
    geoms = [_pool_geometry(s, k, st, p, d, ceil_mode)
             for s, k, st, p, d in zip(spatial, kernel, stride, padding, dilation)]
    config = [(0, 0, 0)] * (x.ndim - nd) + [(p, p + extra, 0) for p, (_, extra) in
                                           zip(padding, geoms)]
    padded = lax.pad(x, jnp.asarray(pad_value, x.dtype), config)
    outs = [g[0] for g in geoms]
    windows, offsets = [], []
    for offset in np.ndindex(*kernel):
        starts = [o * d for o, d in zip(offset, dilation)]
        limits = [s + (n - 1) * st + 1 for s, n, st in zip(starts, outs, stride)]
        view = lax.slice(padded, (0,) * (x.ndim - nd) + tuple(starts),
                         padded.shape[:x.ndim - nd] + tuple(limits),
                         (1,) * (x.ndim - nd) + tuple(stride))
        windows.append(view)
        offsets.append(starts)
    return jnp.stack(windows), offsets, outs


def _pool_args(x, kernel_size, stride, padding, dilation, nd):
    kernel = _tuple(kernel_size, nd)
    stride = _tuple(stride, nd) if stride else kernel
    return kernel, stride, _tuple(padding, nd), _tuple(dilation, nd)


def _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, nd):
    kernel, stride, padding, dilation = _pool_args(x, kernel_size, stride, padding, dilation, nd)
    lowest = -jnp.inf if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.iinfo(x.dtype).min
    windows, offsets, outs = _pool_windows(x, kernel, stride, padding, dilation, ceil_mode, lowest)
    if jnp.issubdtype(x.dtype, jnp.inexact):  # NaN wins, like torch's `val > max || isnan(val)`
        nan = jnp.isnan(windows)
        choice = jnp.argmax(jnp.where(jnp.any(nan, axis=0), nan, windows == jnp.max(windows, 0)),
                            axis=0)
    else:
        choice = jnp.argmax(windows, axis=0)
    values = jnp.take_along_axis(windows, choice[None], axis=0)[0]
    # Flat index into the unpadded spatial plane of the chosen element.
    spatial = x.shape[-nd:]
    offsets = jnp.asarray(offsets, jnp.int64)  # (K, nd)
    flat = jnp.zeros(choice.shape, jnp.int64)
    for axis in range(nd):
        position = lax.broadcasted_iota(jnp.int64, choice.shape, choice.ndim - nd + axis)
        coord = position * stride[axis] - padding[axis] + offsets[choice, axis]
        flat = flat * spatial[axis] + coord
    return values, flat


def _max_pool_backward(grad_output, x, indices, nd):
    lead = x.shape[:-nd]
    plane = int(np.prod(x.shape[-nd:]))
    grad = jnp.zeros(lead + (plane,), grad_output.dtype)
    g = grad_output.reshape(lead + (-1,))
    idx = indices.reshape(lead + (-1,))
    lead_index = tuple(lax.broadcasted_iota(jnp.int64, idx.shape, d) for d in range(len(lead)))
    return grad.at[lead_index + (idx,)].add(g).reshape(x.shape)


@lowers(aten.max_pool2d_with_indices.default)
def aten_max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1,
                                 ceil_mode=False):
    return _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, 2)


@lowers(aten.max_pool3d_with_indices.default)
def aten_max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1,
                                 ceil_mode=False):
    return _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, 3)


@lowers(aten.max_pool2d_with_indices_backward.default)
def aten_max_pool2d_backward(grad_output, x, kernel_size, stride, padding, dilation, ceil_mode,
                             indices):
    return _max_pool_backward(grad_output, x, indices, 2)


@lowers(aten.max_pool3d_with_indices_backward.default)
def aten_max_pool3d_backward(grad_output, x, kernel_size, stride, padding, dilation, ceil_mode,
                             indices):
    return _max_pool_backward(grad_output, x, indices, 3)


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
              nd):
    kernel, stride, padding, dilation = _pool_args(x, kernel_size, stride, padding, 1, nd)
    windows, _, outs = _pool_windows(x, kernel, stride, padding, dilation, ceil_mode, 0)
    total = jnp.sum(windows.astype(_compute_dtype(x)), axis=0)
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
def aten_avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False,
                    count_include_pad=True, divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, 2)


@lowers(aten.avg_pool3d.default)
def aten_avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False,
                    count_include_pad=True, divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, 3)


@lowers(aten.avg_pool2d_backward.default)
def aten_avg_pool2d_backward(grad_output, x, kernel_size, stride, padding, ceil_mode,
                             count_include_pad, divisor_override):
    _, vjp = jax.vjp(lambda x_: _avg_pool(x_, kernel_size, stride, padding, ceil_mode,
                                          count_include_pad, divisor_override, 2), x)
    return vjp(grad_output)[0]


@lowers(aten.avg_pool3d_backward.default)
def aten_avg_pool3d_backward(grad_output, x, kernel_size, stride, padding, ceil_mode,
                             count_include_pad, divisor_override):
    _, vjp = jax.vjp(lambda x_: _avg_pool(x_, kernel_size, stride, padding, ceil_mode,
                                          count_include_pad, divisor_override, 3), x)
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
    output_size = _tuple(output_size, nd)
    out = x.astype(_compute_dtype(x))
    for axis, size in enumerate(output_size):
        dim = x.ndim - nd + axis
        m = jnp.asarray(_adaptive_matrix(x.shape[dim], size), out.dtype)
        out = jnp.moveaxis(jnp.tensordot(out, m, axes=([dim], [1]),
                                         precision=lax.Precision.HIGHEST), -1, dim)
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
    output_size = _tuple(output_size, 2)
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


# -------------------------------------------------------------------------------- upsampling
# Each mode is separable: one 1-D resampling per spatial axis, with torch's source-index rules
# (area_pixel_compute_scale / _source_index in ATen's UpSample.h). Backward ops are the VJP of
# the (linear) forward.
def _output_size(x, nd, output_size, scale_factors):
    if output_size:
        return tuple(int(s) for s in output_size), [None] * nd
    sizes = tuple(int(math.floor(s * f)) for s, f in zip(x.shape[-nd:], scale_factors))
    return sizes, list(scale_factors)


def _pixel_scale(in_size, out_size, align_corners, scale):
    if align_corners:
        return (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    return (1.0 / scale) if scale is not None and scale > 0 else in_size / out_size


def _nearest_source(in_size, out_size, scale, exact):
    ratio = (1.0 / scale) if scale else in_size / out_size
    offset = 0.5 if exact else 0.0
    src = np.floor((np.arange(out_size) + offset) * np.float32(ratio)).astype(np.int64)
    return np.minimum(src, in_size - 1)


def _resample_axis(x, dim, out_size, scale, kind, align_corners):
    in_size = x.shape[dim]
    if kind in ("nearest", "nearest-exact"):
        return jnp.take(x, _nearest_source(in_size, out_size, scale, kind == "nearest-exact"),
                        axis=dim)
    ratio = _pixel_scale(in_size, out_size, align_corners, scale)
    dst = np.arange(out_size, dtype=np.float64)
    shape = [1] * x.ndim
    shape[dim] = -1
    if kind == "linear":
        src = ratio * dst if align_corners else np.maximum(ratio * (dst + 0.5) - 0.5, 0.0)
        lo = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
        hi = np.minimum(lo + 1, in_size - 1)
        frac = jnp.asarray(src - lo, x.dtype).reshape(shape)
        return jnp.take(x, lo, axis=dim) * (1 - frac) + jnp.take(x, hi, axis=dim) * frac
    # cubic: no clamping of the source index; taps clamped to the edge.
    src = ratio * dst if align_corners else ratio * (dst + 0.5) - 0.5
    base = np.floor(src)
    weights = _cubic_weights(src - base)
    out = 0
    for tap, w in enumerate(weights):
        index = np.clip(base.astype(np.int64) - 1 + tap, 0, in_size - 1)
        out = out + jnp.take(x, index, axis=dim) * jnp.asarray(w, x.dtype).reshape(shape)
    return out


def _aa_matrix(in_size, out_size, align_corners, scale, kind):
    """Antialiased resampling weights (ATen's _compute_weights_aa), shape (out, in)."""
    scale = _pixel_scale(in_size, out_size, align_corners, scale)
    interp_size = 2 if kind == "linear" else 4
    support = interp_size * 0.5 * (scale if scale >= 1.0 else 1.0)
    invscale = 1.0 / scale if scale >= 1.0 else 1.0

    def filter_fn(v):
        v = abs(v)
        if kind == "linear":
            return max(0.0, 1.0 - v)
        a = -0.5
        if v < 1.0:
            return ((a + 2) * v - (a + 3)) * v * v + 1
        if v < 2.0:
            return (((v - 5) * v + 8) * v - 4) * a
        return 0.0

    matrix = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        center = scale * (i + 0.5)
        xmin = max(int(center - support + 0.5), 0)
        xsize = min(int(center + support + 0.5), in_size) - xmin
        w = np.array([filter_fn((j + xmin - center + 0.5) * invscale) for j in range(xsize)])
        total = w.sum()
        matrix[i, xmin:xmin + xsize] = w / total if total != 0 else w
    return matrix


def _upsample(x, nd, output_size, scale_factors, kind, align_corners=False, antialias=False):
    """The .vec overloads: an output size or per-axis scale factors."""
    sizes, scales = _output_size(x, nd, output_size, scale_factors)
    return _resample(x, nd, sizes, scales, kind, align_corners, antialias)


def _resample(x, nd, sizes, scales, kind, align_corners, antialias):
    """Resamples the last ``nd`` axes to ``sizes``, one axis at a time."""
    out = x.astype(_compute_dtype(x)) if kind not in ("nearest", "nearest-exact") else x
    for axis in range(nd):
        dim = x.ndim - nd + axis
        if antialias:
            m = jnp.asarray(_aa_matrix(x.shape[dim], sizes[axis], align_corners, scales[axis],
                                       kind), out.dtype)
            out = jnp.moveaxis(jnp.tensordot(out, m, axes=([dim], [1]),
                                             precision=lax.Precision.HIGHEST), -1, dim)
        else:
            out = _resample_axis(out, dim, sizes[axis], scales[axis], kind, align_corners)
    return out.astype(x.dtype)


def _register_upsample(name, nd, kind, has_align, antialias=False):
    packet = getattr(aten, name)
    backward = getattr(aten, f"{name}_backward")

    if has_align:
        def vec(x, output_size, align_corners, scale_factors):
            return _upsample(x, nd, output_size, scale_factors, kind, align_corners, antialias)

        def default(x, output_size, align_corners, *scales):
            return _upsample(x, nd, output_size, None, kind, align_corners, antialias) if all(
                s is None for s in scales) else _upsample_scaled(x, nd, output_size, scales, kind,
                                                                 align_corners, antialias)

        def grad(grad_output, output_size, input_size, align_corners, *scales):
            return _upsample_vjp(grad_output, input_size, lambda x: default(
                x, output_size, align_corners, *scales))
    else:
        def vec(x, output_size, scale_factors):
            return _upsample(x, nd, output_size, scale_factors, kind)

        def default(x, output_size, *scales):
            return _upsample_scaled(x, nd, output_size, scales, kind, False, False)

        def grad(grad_output, output_size, input_size, *scales):
            return _upsample_vjp(grad_output, input_size, lambda x: default(x, output_size, *scales))

    for fn, suffix in ((vec, "vec"), (default, "default"), (grad, "backward")):
        fn.__name__ = f"aten_{name.lstrip('_')}_{suffix}"
    lowers(packet.vec)(vec)
    lowers(packet.default)(default)
    lowers(backward.default)(grad)


def _upsample_scaled(x, nd, output_size, scales, kind, align_corners, antialias):
    """The .default overloads: explicit output size plus optional per-axis scales."""
    scales = list(scales) + [None] * (nd - len(scales))
    sizes = tuple(int(s) for s in output_size)
    return _resample(x, nd, sizes, scales, kind, align_corners, antialias)


def _upsample_vjp(grad_output, input_size, forward):
    zeros = jnp.zeros(tuple(int(s) for s in input_size), grad_output.dtype)
    _, vjp = jax.vjp(forward, zeros)
    return vjp(grad_output)[0]


for _name, _nd, _kind, _align, _aa in [
        ("upsample_nearest1d", 1, "nearest", False, False),
        ("upsample_nearest2d", 2, "nearest", False, False),
        ("upsample_nearest3d", 3, "nearest", False, False),
        ("_upsample_nearest_exact1d", 1, "nearest-exact", False, False),
        ("_upsample_nearest_exact2d", 2, "nearest-exact", False, False),
        ("_upsample_nearest_exact3d", 3, "nearest-exact", False, False),
        ("upsample_linear1d", 1, "linear", True, False),
        ("upsample_bilinear2d", 2, "linear", True, False),
        ("upsample_trilinear3d", 3, "linear", True, False),
        ("upsample_bicubic2d", 2, "cubic", True, False),
        ("_upsample_bilinear2d_aa", 2, "linear", True, True),
        ("_upsample_bicubic2d_aa", 2, "cubic", True, True)]:
    _register_upsample(_name, _nd, _kind, _align, _aa)


# ----------------------------------------------------------------------------------- padding
def _pad(x, pad, mode):
    nd = len(pad) // 2
    widths = [(0, 0)] * (x.ndim - nd) + [(pad[2 * (nd - 1 - i)], pad[2 * (nd - 1 - i) + 1])
                                         for i in range(nd)]
    # Negative widths crop (torch allows them for replication padding).
    crop = tuple(slice(max(-lo, 0), x.shape[i] - max(-hi, 0)) for i, (lo, hi) in enumerate(widths))
    x = x[crop]
    return jnp.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in widths], mode=mode)


for _name, _mode in [("reflection_pad1d", "reflect"), ("reflection_pad2d", "reflect"),
                     ("reflection_pad3d", "reflect"), ("replication_pad1d", "edge"),
                     ("replication_pad2d", "edge"), ("replication_pad3d", "edge")]:
    lowers(getattr(aten, _name).default)(lambda x, padding, _mode=_mode: _pad(x, padding, _mode))


# --------------------------------------------------------------------------------- attention
def _attention_scores(q, k, attn_mask, is_causal, scale):
    """q k^T * scale with the causal and explicit masks applied (torch's math backend)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = jnp.einsum("...qd,...kd->...qk", q, k, precision=dot_precision(q, k),
                        preferred_element_type=accumulation_dtype(q.dtype)) * scale
    if is_causal:
        lq, lk = q.shape[-2], k.shape[-2]
        causal = jnp.tril(jnp.ones((lq, lk), jnp.bool_))
        scores = jnp.where(causal, scores, -jnp.inf)
    if attn_mask is not None:
        scores = jnp.where(attn_mask, scores, -jnp.inf) if attn_mask.dtype == jnp.bool_ else (
            scores + attn_mask)
    return scores


def _repeat_kv_heads(q, k, v):
    """Grouped-query attention (fewer key/value heads than query heads, as torch's CPU kernels
    accept without a flag in their backward): each key/value head serves its group."""
    if k.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        repeat = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, repeat, axis=-3), jnp.repeat(v, repeat, axis=-3)
    return k, v


def attention(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """softmax(q k^T * scale + mask) v, computed as torch's math backend does."""
    k, v = _repeat_kv_heads(q, k, v)
    scores = _attention_scores(q, k, attn_mask, is_causal, scale)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("...qk,...kd->...qd", probs, v, precision=dot_precision(probs, v),
                      preferred_element_type=accumulation_dtype(v.dtype)).astype(q.dtype)


@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def aten_sdpa_flash_cpu_backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *,
                                 attn_mask=None, scale=None):
    if dropout_p:
        raise NotImplementedError(
            "the CPU flash-attention backward with dropout_p > 0 cannot replay torch's dropout "
            "mask; use dropout_p=0 in scaled_dot_product_attention or a separate nn.Dropout.")
    _, vjp = jax.vjp(lambda q_, k_, v_: attention(q_, k_, v_, attn_mask, is_causal, scale),
                     q, k, v)
    return vjp(grad_out.astype(q.dtype))


@lowers(aten._scaled_dot_product_flash_attention_for_cpu.default)
def aten_sdpa_flash_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if dropout_p:
        raise NotImplementedError("flash attention with dropout_p > 0 is not lowered.")
    out = attention(q, k, v, attn_mask, is_causal, scale)
    k, _ = _repeat_kv_heads(q, k, v)
    scores = _attention_scores(q, k, attn_mask, is_causal, scale).astype(jnp.float32)
    return out, jax.nn.logsumexp(scores, axis=-1)


# ------------------------------------------------------------------------------ grid sampling
def _grid_unnormalize(coord, size, align_corners):
    # [-1, 1] -> [0, size - 1] (align_corners) or [-0.5, size - 0.5].
    if align_corners:
        return (coord + 1) * ((size - 1) / 2)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _grid_pad_coordinates(coord, size, padding_mode, align_corners):
    if padding_mode == 1:  # border
        return jnp.clip(coord, 0, size - 1)
    if padding_mode == 2:  # reflection
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        return jnp.clip(coord, 0, size - 1)
    return coord


def _grid_gather(x, coords):
    """x[n, :, *coords[n, ...]] with zeros where any coordinate is out of bounds.

    x: (N, C, *spatial); coords: integer-valued float arrays (N, *out), one per spatial dim in
    torch's (depth, height, width) order. Returns (N, C, *out).
    """
    spatial = x.shape[2:]
    n, c = x.shape[:2]
    valid = jnp.ones(coords[0].shape, jnp.bool_)
    flat = jnp.zeros(coords[0].shape, jnp.int64)
    for coord, size in zip(coords, spatial):
        index = coord.astype(jnp.int64)
        valid = valid & (coord >= 0) & (coord <= size - 1)
        flat = flat * size + jnp.clip(index, 0, size - 1)
    out_shape = coords[0].shape[1:]
    flat = flat.reshape(n, 1, -1)
    values = jnp.take_along_axis(x.reshape(n, c, -1), jnp.broadcast_to(flat, (n, c, flat.shape[-1])),
                                 axis=2).reshape((n, c) + out_shape)
    return jnp.where(valid[:, None], values, jnp.zeros((), x.dtype))


def _cubic_weights(t):
    a = -0.75
    def near(s):  # |s| <= 1
        return ((a + 2) * s - (a + 3)) * s * s + 1

    def far(s):  # 1 < |s| < 2
        return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a

    return far(t + 1), near(t), near(1 - t), far(2 - t)


def _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners):
    nd = x.ndim - 2
    spatial = x.shape[2:]
    # grid[..., 0] indexes the last spatial dim (x/width), grid[..., -1] the first.
    raw = [grid[..., nd - 1 - i] for i in range(nd)]
    if interpolation_mode == 2:  # bicubic (2-D only)
        src = [_grid_unnormalize(r, s, align_corners) for r, s in zip(raw, spatial)]
        base = [jnp.floor(s) for s in src]
        wy, wx = (_cubic_weights(s - b) for s, b in zip(src, base))
        out = 0
        for i in range(4):
            row = 0
            for j in range(4):
                cy = _grid_pad_coordinates(base[0] - 1 + i, spatial[0], padding_mode, align_corners)
                cx = _grid_pad_coordinates(base[1] - 1 + j, spatial[1], padding_mode, align_corners)
                row = row + _grid_gather(x, [jnp.trunc(cy), jnp.trunc(cx)]) * wx[j][:, None]
            out = out + row * wy[i][:, None]
        return out
    src = [_grid_pad_coordinates(_grid_unnormalize(r, s, align_corners), s, padding_mode,
                                 align_corners) for r, s in zip(raw, spatial)]
    if interpolation_mode == 1:  # nearest, ties to even as nearbyint
        return _grid_gather(x, [jnp.round(s) for s in src])
    base = [jnp.floor(s) for s in src]
    out = 0
    for corner in np.ndindex(*(2,) * nd):
        coords, weight = [], 1
        for s, b, bit in zip(src, base, corner):
            coords.append(b + bit)
            weight = weight * ((s - b) if bit else (b + 1 - s))
        out = out + _grid_gather(x, coords) * weight[:, None]
    return out


# - func: grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode, int padding_mode,
#   bool align_corners) -> Tensor
@lowers(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def aten_grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(x, grid.astype(x.dtype), interpolation_mode, padding_mode,
                        align_corners).astype(x.dtype)


@lowers(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def aten_grid_sampler_backward(grad_output, x, grid, interpolation_mode, padding_mode,
                               align_corners, output_mask):
    _, vjp = jax.vjp(lambda x_, g_: _grid_sample(x_, g_, interpolation_mode, padding_mode,
                                                 align_corners), x, grid)
    grad_x, grad_grid = vjp(grad_output.astype(x.dtype))
    return (grad_x if output_mask[0] else None), grad_grid


# ------------------------------------------------------------------- normalisation backward
# These are decomposed by core_aten_decompositions; lowered too so graphs captured without the
# decomposition table still run.
@lowers(aten.native_layer_norm_backward.default)
def aten_native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias,
                                    output_mask):
    axis = x.ndim - len(normalized_shape)
    axes = tuple(range(axis, x.ndim))
    xc = x.astype(_compute_dtype(x))
    xhat = (xc - mean) * rstd
    g = grad_out.astype(xc.dtype)
    gw = g * weight if weight is not None else g
    n = math.prod(x.shape[axis:])
    grad_x = None
    if output_mask[0]:
        grad_x = (rstd / n) * (n * gw - jnp.sum(gw, axes, keepdims=True)
                               - xhat * jnp.sum(gw * xhat, axes, keepdims=True))
        grad_x = grad_x.astype(x.dtype)
    lead = tuple(range(axis))
    grad_w = jnp.sum(g * xhat, lead).astype(weight.dtype) if (
        output_mask[1] and weight is not None) else None
    grad_b = jnp.sum(g, lead).astype(bias.dtype) if (output_mask[2] and bias is not None) else None
    return grad_x, grad_w, grad_b


@lowers(aten.native_group_norm_backward.default)
def aten_native_group_norm_backward(grad_out, x, mean, rstd, weight, n, c, hxw, group,
                                    output_mask):
    xc = x.astype(_compute_dtype(x))
    grouped = xc.reshape(n, group, (c // group) * hxw)
    xhat = ((grouped - mean.reshape(n, group, 1)) * rstd.reshape(n, group, 1)).reshape(x.shape)
    g = grad_out.astype(xc.dtype)
    channel_shape = (1, c) + (1,) * (x.ndim - 2)
    gw = g * weight.reshape(channel_shape) if weight is not None else g
    grad_x = None
    if output_mask[0]:
        gw_g = gw.reshape(n, group, (c // group) * hxw)
        xhat_g = xhat.reshape(n, group, (c // group) * hxw)
        m = gw_g.shape[-1]
        r = rstd.reshape(n, group, 1)
        grad_x = (r / m) * (m * gw_g - jnp.sum(gw_g, -1, keepdims=True)
                            - xhat_g * jnp.sum(gw_g * xhat_g, -1, keepdims=True))
        grad_x = grad_x.reshape(x.shape).astype(x.dtype)
    axes = (0,) + tuple(range(2, x.ndim))
    grad_w = jnp.sum(g * xhat, axes).astype(x.dtype) if output_mask[1] else None
    grad_b = jnp.sum(g, axes).astype(x.dtype) if output_mask[2] else None
    return grad_x, grad_w, grad_b


# ---------------------------------------------------------------- batch norm (update variants)
# - func: _batch_norm_with_update_functional(Tensor input, Tensor? weight, Tensor? bias,
#   Tensor running_mean, Tensor running_var, float momentum, float eps)
#   -> (Tensor, Tensor, Tensor, Tensor, Tensor running_mean_out, Tensor running_var_out)
@lowers(aten._batch_norm_with_update_functional.default)
def aten_batch_norm_with_update_functional(x, weight, bias, running_mean, running_var, momentum,
                                           eps):
    out, mean, rstd, var = _batch_norm_train(x, weight, bias, eps)
    new_mean, new_var = _updated_running_stats(x, mean, var, running_mean, running_var, momentum)
    reserve = jnp.zeros((0,), jnp.uint8)
    return out, mean, rstd, reserve, new_mean, new_var


@lowers(aten._batch_norm_no_update.default)
def aten_batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    empty = jnp.zeros((0,), x.dtype)
    if running_mean is None:
        out, mean, rstd, _ = _batch_norm_train(x, weight, bias, eps)
        return out, mean, rstd, jnp.zeros((0,), jnp.uint8)
    out = _batch_norm_eval(x, weight, bias, running_mean, running_var, eps)
    return out, empty, empty, jnp.zeros((0,), jnp.uint8)


def _batch_norm_grads(grad_out, x, weight, mean, invstd, train, output_mask):
    axes = (0,) + tuple(range(2, x.ndim))
    shape = _channel_shape(x)
    xc = x.astype(_compute_dtype(x))
    g = grad_out.astype(xc.dtype)
    xhat = (xc - mean.reshape(shape)) * invstd.reshape(shape)
    w = jnp.ones((), xc.dtype) if weight is None else weight.reshape(shape).astype(xc.dtype)
    grad_x = None
    if output_mask[0]:
        if train:
            n = x.size // x.shape[1]
            sum_g = jnp.sum(g, axes, keepdims=True)
            sum_gx = jnp.sum(g * xhat, axes, keepdims=True)
            grad_x = w * invstd.reshape(shape) / n * (n * g - sum_g - xhat * sum_gx)
        else:
            grad_x = g * w * invstd.reshape(shape)
        grad_x = grad_x.astype(x.dtype)
    grad_w = jnp.sum(g * xhat, axes).astype(x.dtype) if output_mask[1] else None
    grad_b = jnp.sum(g, axes).astype(x.dtype) if output_mask[2] else None
    return grad_x, grad_w, grad_b


# - func: native_batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight,
#   Tensor? running_mean, Tensor? running_var, Tensor? save_mean, Tensor? save_invstd,
#   bool train, float eps, bool[3] output_mask) -> (Tensor, Tensor, Tensor)
@lowers(aten.native_batch_norm_backward.default)
def aten_native_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean,
                                    save_invstd, train, eps, output_mask):
    if train:
        return _batch_norm_grads(grad_out, x, weight, save_mean, save_invstd, True, output_mask)
    invstd = lax.rsqrt(running_var.astype(_compute_dtype(x)) + eps)
    return _batch_norm_grads(grad_out, x, weight, running_mean, invstd, False, output_mask)


@lowers(aten.batch_norm_backward.default)
def aten_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_var,
                             update, eps, output_mask, reserve):
    train = update or running_mean is None
    return aten_native_batch_norm_backward(grad_out, x, weight, running_mean, running_var,
                                           save_mean, save_var, train, eps, output_mask)


# ------------------------------------------------------------------------------ misc layers
# - func: _trilinear(Tensor i1, Tensor i2, Tensor i3, int[] expand1, int[] expand2,
#   int[] expand3, int[] sumdim, int unroll_dim=1) -> Tensor
@lowers(aten._trilinear.default)
def aten_trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """The product of the three inputs (unsqueezed at their expand dims), summed over sumdim;
    summed dims stay as size 1."""
    i1, i2, i3 = promote(i1, i2, i3)
    total = i1.ndim + len(expand1)
    letters = "abcdefghijklmnopqrstuvwxyz"[:total]
    subs = []
    for expand in (expand1, expand2, expand3):
        subs.append("".join(letters[d] for d in range(total) if d not in set(expand)))
    keep = [d for d in range(total) if d not in set(sumdim)]
    out = jnp.einsum(f"{subs[0]},{subs[1]},{subs[2]}->{''.join(letters[d] for d in keep)}",
                     i1, i2, i3, precision=dot_precision(i1, i2, i3))
    shape = []
    operands = [(i1, set(expand1)), (i2, set(expand2)), (i3, set(expand3))]
    for d in range(total):
        if d in set(sumdim):
            shape.append(1)
            continue
        size = 1
        for arr, expand in operands:
            if d not in expand:
                size = arr.shape[[e for e in range(total) if e not in expand].index(d)]
        shape.append(size)
    return out.reshape([n for d, n in enumerate(shape) if d not in set(sumdim)]).astype(i1.dtype)


@lowers(aten.dist.default)
def aten_dist(x, other, p=2):
    x, other = promote(x, other)
    diff = jnp.abs(x - other).reshape(-1)
    if p == 0:
        return jnp.sum((diff != 0).astype(x.dtype))
    if p == float("inf"):
        return jnp.max(diff) if diff.size else jnp.zeros((), x.dtype)
    if p == float("-inf"):
        return jnp.min(diff) if diff.size else jnp.zeros((), x.dtype)
    if p == 1:
        return jnp.sum(diff)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff))
    return jnp.sum(diff**p) ** (1.0 / p)


# -------------------------------------------------------------------- adaptive max pooling
def _adaptive_max_pool(x, output_size, nd):
    output_size = _tuple(output_size, nd)
    spatial = x.shape[-nd:]
    bounds = [[((i * n) // o, -(-((i + 1) * n) // o)) for i in range(o)]
              for n, o in zip(spatial, output_size)]
    values, indices = [], []
    for cell in np.ndindex(*output_size):
        window = x[(Ellipsis,) + tuple(slice(*bounds[a][c]) for a, c in enumerate(cell))]
        wshape = window.shape[-nd:]
        flat = window.reshape(x.shape[:-nd] + (-1,))
        if jnp.issubdtype(x.dtype, jnp.inexact):  # NaN wins, as in torch
            k = jnp.argmax(jnp.where(jnp.any(jnp.isnan(flat), -1, keepdims=True),
                                     jnp.isnan(flat), flat == jnp.max(flat, -1, keepdims=True)), -1)
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
    return (jnp.stack(values, -1).reshape(shape),
            jnp.stack(indices, -1).reshape(shape).astype(jnp.int64))


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
    starts = (jnp.floor((i + samples[..., None]) * alpha) - jnp.floor(samples[..., None] * alpha))
    starts = starts.astype(jnp.int64)
    last = jnp.full(samples.shape + (1,), in_size - kernel, jnp.int64)
    return jnp.concatenate([starts, last], axis=-1)


def _fractional_max_pool(x, kernel_size, output_size, samples, nd):
    kernel = _tuple(kernel_size, nd)
    output_size = _tuple(output_size, nd)
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
            flat_index.shape)
        if best_v is None:
            best_v, best_i = v, flat_index
        else:
            better = (v > best_v) | (jnp.isnan(v) & ~jnp.isnan(best_v)) if jnp.issubdtype(
                x.dtype, jnp.inexact) else v > best_v
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


# ------------------------------------------------------------------------ padding backward
def _register_pad_backward(name, mode):
    def lowering(grad_output, x, padding):
        _, vjp = jax.vjp(lambda x_: _pad(x_, padding, mode), x)
        return vjp(grad_output.astype(x.dtype))[0]

    lowering.__name__ = f"aten_{name}_backward"
    lowers(getattr(aten, f"{name}_backward").default)(lowering)


for _name, _mode in [("reflection_pad1d", "reflect"), ("reflection_pad2d", "reflect"),
                     ("reflection_pad3d", "reflect"), ("replication_pad1d", "edge"),
                     ("replication_pad2d", "edge"), ("replication_pad3d", "edge")]:
    _register_pad_backward(_name, _mode)


# ----------------------------------------------------------------------- loss backward ops
def _reduce_loss(loss, reduction):
    if reduction == 1:
        return jnp.mean(loss)
    if reduction == 2:
        return jnp.sum(loss)
    return loss


def _multi_margin_loss(x, target, p, margin, weight, reduction):
    unbatched = x.ndim <= 1
    if unbatched:
        x, target = x.reshape(1, -1), target.reshape(1)
    c = x.shape[1]
    picked = jnp.take_along_axis(x, target[:, None], axis=1)
    terms = jnp.maximum(margin - picked + x, 0)
    if p == 2:
        terms = terms * terms
    if weight is not None:
        terms = terms * weight[target][:, None]
    terms = jnp.where(jnp.arange(c)[None, :] == target[:, None], 0, terms)
    loss = jnp.sum(terms, axis=1) / c
    if unbatched:
        loss = loss[0]
    return _reduce_loss(loss, reduction)


# - func: multi_margin_loss_backward(Tensor grad_output, Tensor self, Tensor target, Scalar p,
#   Scalar margin, Tensor? weight=None, int reduction=Mean) -> Tensor
@lowers(aten.multi_margin_loss_backward.default)
def aten_multi_margin_loss_backward(grad_output, x, target, p, margin, weight=None, reduction=1):
    _, vjp = jax.vjp(lambda x_: _multi_margin_loss(x_, target, p, margin, weight, reduction), x)
    return vjp(grad_output.astype(x.dtype))[0]


def _multilabel_margin_loss(x, target, is_target, reduction):
    unbatched = x.ndim <= 1
    shape = x.shape
    if unbatched:
        x, target, is_target = (x.reshape(1, -1), target.reshape(1, -1),
                                is_target.reshape(1, -1))
    c = x.shape[1]
    # Targets are the entries before the first -1.
    valid = jnp.cumprod((target >= 0).astype(jnp.int32), axis=1).astype(jnp.bool_)
    picked = jnp.take_along_axis(x, jnp.clip(target, 0, c - 1), axis=1)  # (N, C)
    hinge = jnp.maximum(1 - picked[:, :, None] + x[:, None, :], 0)  # (N, target slot, class)
    mask = valid[:, :, None] & (is_target[:, None, :] == 0)
    loss = jnp.sum(jnp.where(mask, hinge, 0), axis=(1, 2)) / c
    if unbatched:
        loss = loss[0]
    del shape
    return _reduce_loss(loss, reduction)


# - func: multilabel_margin_loss_backward(Tensor grad_output, Tensor self, Tensor target,
#   int reduction, Tensor is_target) -> Tensor
@lowers(aten.multilabel_margin_loss_backward.default)
def aten_multilabel_margin_loss_backward(grad_output, x, target, reduction, is_target):
    _, vjp = jax.vjp(lambda x_: _multilabel_margin_loss(x_, target, is_target, reduction), x)
    return vjp(grad_output.astype(x.dtype))[0]


@lowers(aten.multilabel_margin_loss_forward.default)
def aten_multilabel_margin_loss_forward(x, target, reduction):
    unbatched = x.ndim == 1
    t = target[None] if unbatched else target
    c = x.shape[-1]
    valid = jnp.cumprod((t >= 0).astype(jnp.int32), axis=1).astype(jnp.bool_)
    is_target = jnp.zeros(t.shape, x.dtype).at[
        jnp.arange(t.shape[0])[:, None], jnp.where(valid, t, c)].set(1, mode="drop")
    if unbatched:
        is_target = is_target[0]
    return _multilabel_margin_loss(x, target, is_target, reduction), is_target


@lowers(aten.avg_pool1d.default)
def aten_avg_pool1d(x, kernel_size, stride=(), padding=0, ceil_mode=False,
                    count_include_pad=True):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1)


@lowers(aten.adaptive_avg_pool1d.default)
def aten_adaptive_avg_pool1d(x, output_size):
    return _adaptive_avg_pool(x, output_size, 1)
