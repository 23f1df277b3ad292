"""Neural-network lowerings: convolution, upsampling, padding, grid sampling and the backward
ops of losses. Pooling, normalisation and attention have their own modules.

Backward ops that torch does not decompose (convolution_backward, padding backward) are
lowered as ``jax.vjp`` of the forward lowering, so forward and backward share one definition.
A CPU step the engine runs itself computes its convolutions and their gradients with torch's
own kernels instead (``ops.torch_kernels``).
"""

from __future__ import annotations

import math

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from jax_backend import native_loss
from jax_backend.ops import torch_kernels
from jax_backend.ops._common import (
    compute_dtype,
    conv_precision,
    dot_precision,
    dot_result_dtype,
    ntuple,
    opmath_dtype,
    promote,
)
from jax_backend.ops.reduction import aten_sum
from jax_backend.registry import lowers

aten = torch.ops.aten


# ------------------------------------------------------------------------------- convolution
def _conv_forward(
    x,
    weight,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    result_dtype=dot_result_dtype,
):
    """The convolution in the operands' (promoted) dtype."""
    out = _conv_accumulated(
        x, weight, stride, padding, dilation, transposed, output_padding, groups, result_dtype
    )
    return out.astype(promote(x, weight)[0].dtype)


def _conv_accumulated(
    x,
    weight,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    result_dtype=dot_result_dtype,
):
    """The convolution in the dtype ``result_dtype`` asks of the platform (fp32 for half
    operands on a CPU), before any rounding to the operands' dtype."""
    nd = weight.ndim - 2
    x, weight = promote(x, weight)
    spatial = "DHW"[-nd:] if nd <= 3 else None
    dimension_numbers = ("NC" + spatial, "OI" + spatial, "NC" + spatial)
    stride, padding, dilation = ntuple(stride, nd), ntuple(padding, nd), ntuple(dilation, nd)
    options = dict(
        precision=conv_precision(x, weight), preferred_element_type=result_dtype(x.dtype)
    )
    if not transposed:
        out = lax.conv_general_dilated(
            x,
            weight,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            rhs_dilation=dilation,
            dimension_numbers=dimension_numbers,
            feature_group_count=groups,
            **options,
        )
        return out
    # A transposed convolution is the input-gradient of a convolution: dilate the input by the
    # stride, pad by dilation*(k-1)-p, and convolve with the flipped, in/out-swapped kernel.
    output_padding = ntuple(output_padding, nd)
    c_in, c_out_per_group = weight.shape[0], weight.shape[1]
    kernel = weight.reshape((groups, c_in // groups, c_out_per_group) + weight.shape[2:])
    kernel = jnp.swapaxes(kernel, 1, 2).reshape(
        (groups * c_out_per_group, c_in // groups) + weight.shape[2:]
    )
    kernel = jnp.flip(kernel, axis=tuple(range(2, 2 + nd)))
    pads = []
    for k, p, d, op in zip(weight.shape[2:], padding, dilation, output_padding):
        edge = d * (k - 1) - p
        pads.append((edge, edge + op))
    out = lax.conv_general_dilated(
        x,
        kernel,
        window_strides=(1,) * nd,
        padding=pads,
        lhs_dilation=stride,
        rhs_dilation=dilation,
        dimension_numbers=dimension_numbers,
        feature_group_count=groups,
        **options,
    )
    return out


@lowers(aten.convolution.default)
def aten_convolution(
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups
):
    unbatched = x.ndim == weight.ndim - 1
    if unbatched:
        x = x[None]
    # The bias joins the accumulated result and the sum is rounded once, as torch's CPU
    # (oneDNN) half convolutions do; where the platform gives half results (a GPU), it is
    # added to them, as torch's CUDA convolutions add it after cuDNN's.
    if torch_kernels.applies(x, weight, bias):
        out = torch_kernels.convolution(
            x, weight, bias, stride, padding, dilation, transposed, output_padding, groups
        )
    else:
        out = _conv_accumulated(
            x, weight, stride, padding, dilation, transposed, output_padding, groups
        )
        if bias is not None:
            out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * (out.ndim - 2))
    out = out.astype(promote(x, weight)[0].dtype)
    return out[0] if unbatched else out


def _replayed(linear, accumulate, *args):
    """``linear(*args)`` with each of its convolutions asking for ``accumulate`` results, then
    rounded to the dtype it gave before (how the forward treats its own convolution)."""
    closed = jax.make_jaxpr(linear)(*args)
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, args))

    def read(atom):
        return atom.val if isinstance(atom, jax.extend.core.Literal) else env[atom]

    for eqn in closed.jaxpr.eqns:
        params = eqn.params
        replay = eqn.primitive is lax.conv_general_dilated_p
        if replay:
            params = dict(params, preferred_element_type=np.dtype(accumulate))
        outs = eqn.primitive.bind(*[read(v) for v in eqn.invars], **params)
        outs = outs if eqn.primitive.multiple_results else [outs]
        if replay:
            outs = [o.astype(v.aval.dtype) for o, v in zip(outs, eqn.outvars)]
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in closed.jaxpr.outvars]


def _convolution_gradient(forward, primal, grad_output):
    """The gradient of ``forward`` (a convolution, linear in ``primal``, whose result has the
    operands' dtype) at ``grad_output``, as autocast computes it: half operands give a half
    gradient, accumulating in the dtype ``dot_result_dtype`` asks of the platform.

    The transpose of the lowering's own forward would not do: on a CPU that forward asks for an
    fp32 result and casts it, and JAX transposes a convolution in the cotangent's dtype, so
    both gradient convolutions became fp32 ones. Here the transpose of the half forward is
    traced and its convolutions replayed with the forward's accumulation request."""
    transpose = jax.linear_transpose(forward, primal)
    accumulate = dot_result_dtype(primal.dtype)
    if accumulate is None:
        return transpose(grad_output)[0]
    return _replayed(transpose, accumulate, grad_output)[0]


@lowers(aten.convolution_backward.default)
def aten_convolution_backward(
    grad_output,
    x,
    weight,
    bias_sizes,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    output_mask,
):
    dtypes = (x.dtype, weight.dtype)  # the gradients take them (torch's are never mixed)
    x, weight = promote(x, weight)
    cotangent = grad_output.astype(x.dtype)
    if x.ndim == weight.ndim and torch_kernels.applies(cotangent, x, weight):
        grads = torch_kernels.convolution_backward(
            cotangent,
            x,
            weight,
            bias_sizes,
            stride,
            padding,
            dilation,
            transposed,
            output_padding,
            groups,
            output_mask,
        )
        return tuple(
            None if g is None else g.astype(d) for g, d in zip(grads, (*dtypes, grad_output.dtype))
        )

    def forward(x_, w_):
        return _conv_forward(
            x_,
            w_,
            stride,
            padding,
            dilation,
            transposed,
            output_padding,
            groups,
            result_dtype=lambda dtype: None,
        )

    grad_x = grad_w = grad_b = None
    if output_mask[0]:
        grad_x = _convolution_gradient(lambda x_: forward(x_, weight), x, cotangent)
        grad_x = grad_x.astype(dtypes[0])
    if output_mask[1]:
        grad_w = _convolution_gradient(lambda w_: forward(x, w_), weight, cotangent)
        grad_w = grad_w.astype(dtypes[1])
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad_output.ndim))
        grad_b = jnp.sum(grad_output, axis=axes)
    return grad_x, grad_w, grad_b


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
        return jnp.take(
            x, _nearest_source(in_size, out_size, scale, kind == "nearest-exact"), axis=dim
        )
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
        matrix[i, xmin : xmin + xsize] = w / total if total != 0 else w
    return matrix


def _upsample(x, nd, output_size, scale_factors, kind, align_corners=False, antialias=False):
    """The .vec overloads: an output size or per-axis scale factors."""
    sizes, scales = _output_size(x, nd, output_size, scale_factors)
    return _resample(x, nd, sizes, scales, kind, align_corners, antialias)


def _resample(x, nd, sizes, scales, kind, align_corners, antialias):
    """Resamples the last ``nd`` axes to ``sizes``, one axis at a time."""
    out = x.astype(compute_dtype(x)) if kind not in ("nearest", "nearest-exact") else x
    for axis in range(nd):
        dim = x.ndim - nd + axis
        if antialias:
            m = jnp.asarray(
                _aa_matrix(x.shape[dim], sizes[axis], align_corners, scales[axis], kind), out.dtype
            )
            out = jnp.moveaxis(
                jnp.tensordot(out, m, axes=([dim], [1]), precision=lax.Precision.HIGHEST), -1, dim
            )
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
            return (
                _upsample(x, nd, output_size, None, kind, align_corners, antialias)
                if all(s is None for s in scales)
                else _upsample_scaled(x, nd, output_size, scales, kind, align_corners, antialias)
            )

        def grad(grad_output, output_size, input_size, align_corners, *scales):
            return _upsample_vjp(
                grad_output, input_size, lambda x: default(x, output_size, align_corners, *scales)
            )
    else:  # (other signatures: these ops take no align_corners)

        def vec(x, output_size, scale_factors):  # type: ignore[misc]
            return _upsample(x, nd, output_size, scale_factors, kind)

        def default(x, output_size, *scales):  # type: ignore[misc]
            return _upsample_scaled(x, nd, output_size, scales, kind, False, False)

        def grad(grad_output, output_size, input_size, *scales):  # type: ignore[misc]
            return _upsample_vjp(
                grad_output, input_size, lambda x: default(x, output_size, *scales)
            )

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
    ("_upsample_bicubic2d_aa", 2, "cubic", True, True),
]:
    _register_upsample(_name, _nd, _kind, _align, _aa)


# ----------------------------------------------------------------------------------- padding
def _pad(x, pad, mode):
    nd = len(pad) // 2
    widths = [(0, 0)] * (x.ndim - nd) + [
        (pad[2 * (nd - 1 - i)], pad[2 * (nd - 1 - i) + 1]) for i in range(nd)
    ]
    # Negative widths crop (torch allows them for replication padding).
    crop = tuple(slice(max(-lo, 0), x.shape[i] - max(-hi, 0)) for i, (lo, hi) in enumerate(widths))
    x = x[crop]
    return jnp.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in widths], mode=mode)


for _name, _mode in [
    ("reflection_pad1d", "reflect"),
    ("reflection_pad2d", "reflect"),
    ("reflection_pad3d", "reflect"),
    ("replication_pad1d", "edge"),
    ("replication_pad2d", "edge"),
    ("replication_pad3d", "edge"),
]:
    lowers(getattr(aten, _name).default)(lambda x, padding, _mode=_mode: _pad(x, padding, _mode))


# ------------------------------------------------------------------------ padding backward
def _register_pad_backward(name, mode):
    def lowering(grad_output, x, padding):
        _, vjp = jax.vjp(lambda x_: _pad(x_, padding, mode), x)
        return vjp(grad_output.astype(x.dtype))[0]

    lowering.__name__ = f"aten_{name}_backward"
    lowers(getattr(aten, f"{name}_backward").default)(lowering)


for _name, _mode in [
    ("reflection_pad1d", "reflect"),
    ("reflection_pad2d", "reflect"),
    ("reflection_pad3d", "reflect"),
    ("replication_pad1d", "edge"),
    ("replication_pad2d", "edge"),
    ("replication_pad3d", "edge"),
]:
    _register_pad_backward(_name, _mode)


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
    values = jnp.take_along_axis(
        x.reshape(n, c, -1), jnp.broadcast_to(flat, (n, c, flat.shape[-1])), axis=2
    ).reshape((n, c) + out_shape)
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
    src = [
        _grid_pad_coordinates(
            _grid_unnormalize(r, s, align_corners), s, padding_mode, align_corners
        )
        for r, s in zip(raw, spatial)
    ]
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
    return _grid_sample(
        x, grid.astype(x.dtype), interpolation_mode, padding_mode, align_corners
    ).astype(x.dtype)


@lowers(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def aten_grid_sampler_backward(
    grad_output, x, grid, interpolation_mode, padding_mode, align_corners, output_mask
):
    _, vjp = jax.vjp(
        lambda x_, g_: _grid_sample(x_, g_, interpolation_mode, padding_mode, align_corners),
        x,
        grid,
    )
    grad_x, grad_grid = vjp(grad_output.astype(x.dtype))
    return (grad_x if output_mask[0] else None), grad_grid


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
    out = jnp.einsum(
        f"{subs[0]},{subs[1]},{subs[2]}->{''.join(letters[d] for d in keep)}",
        i1,
        i2,
        i3,
        precision=dot_precision(i1, i2, i3),
    )
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


# ----------------------------------------------------------------------- negative log-likelihood
# Lowered whole, forward and backward (capture keeps them from its decomposition table): the
# decompositions' gather and scatter cost the capture ~20 ms and XLA a dozen kernels for what
# is one pick per row. reduction: 0 none, 1 mean, 2 sum.
_MEAN = 1


def _nll_rows(x, target, weight, ignore_index):
    """(``x`` as [N, C] rows, the class each row picks (0 where it picks none), whether the
    row counts, whether it counts with a class out of range, the picked class's weight or
    None). torch stops on such a class ("Target ... is out of bounds"); a compiled step
    cannot, so those rows give NaN."""
    rows = x.reshape(-1, x.shape[-1])
    classes = target.reshape(-1)[: rows.shape[0]]  # an unbatched input uses target[0]
    counted = classes != ignore_index
    bad = counted & ((classes < 0) | (classes >= rows.shape[1]))
    picked = jnp.where(counted & ~bad, classes, 0)
    class_weight = None if weight is None else jnp.take(weight, picked, mode="clip")
    return rows, picked, counted, bad, class_weight


# - func: nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int reduction,
#   SymInt ignore_index) -> (Tensor output, Tensor total_weight)
@lowers(aten.nll_loss_forward.default)
def aten_nll_loss_forward(x, target, weight, reduction, ignore_index):
    if native_loss.nll_applies(x, target, weight, reduction):  # the engine's CPU program
        return native_loss.nll_loss(x, target, weight, reduction, ignore_index)
    rows, picked, counted, bad, class_weight = _nll_rows(x, target, weight, ignore_index)
    value = jnp.take_along_axis(rows, picked[:, None], axis=1, mode="promise_in_bounds")[:, 0]
    if class_weight is not None:
        value = value * class_weight
    loss = jnp.where(counted, -value, jnp.zeros((), x.dtype))
    loss = jnp.where(bad, jnp.full((), jnp.nan, x.dtype), loss)
    if reduction == 0 and x.ndim > 1:
        return loss, jnp.zeros((), x.dtype)
    zero = jnp.zeros((), x.dtype)
    weights = (
        counted.astype(x.dtype) if class_weight is None else jnp.where(counted, class_weight, zero)
    )
    if reduction == 0:
        return loss.reshape(()), aten_sum(weights)
    # The losses and the weights summed as rows of one [2, N] array, in float32 for half types
    # (as torch's kernel): XLA's CPU compiler splits a lone vector's sum under 4096 elements
    # into three kernels, so two sums were six kernels to compile and the pair is one.
    loss, total_weight = jnp.sum(jnp.stack([loss, weights]).astype(opmath_dtype(x.dtype)), axis=1)
    loss = loss / total_weight if reduction == _MEAN else loss
    return loss.astype(x.dtype), total_weight.astype(x.dtype)


# - func: nll_loss_backward(Tensor grad_output, Tensor self, Tensor target, Tensor? weight,
#   int reduction, SymInt ignore_index, Tensor total_weight) -> Tensor
@lowers(aten.nll_loss_backward.default)
def aten_nll_loss_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight):
    if grad_output.dtype == jnp.float32 and native_loss.nll_applies(x, target, weight, reduction):
        return native_loss.nll_loss_backward(
            grad_output, x, target, weight, reduction, ignore_index, total_weight
        )
    rows, picked, counted, bad, class_weight = _nll_rows(x, target, weight, ignore_index)
    g = grad_output / total_weight if reduction == _MEAN else grad_output
    g = jnp.broadcast_to(g.reshape(-1), picked.shape)  # a scalar, or one per row (none)
    if class_weight is not None:
        g = g * class_weight
    value = jnp.where(counted, -g, jnp.zeros((), g.dtype))
    value = jnp.where(bad, jnp.full((), jnp.nan, g.dtype), value)
    hit = (jnp.arange(rows.shape[1], dtype=picked.dtype)[None, :] == picked[:, None]) | bad[:, None]
    grad = jnp.where(hit, value[:, None], jnp.zeros((), g.dtype))
    return grad.reshape(x.shape).astype(x.dtype)


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
        x, target, is_target = (x.reshape(1, -1), target.reshape(1, -1), is_target.reshape(1, -1))
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
    is_target = (
        jnp.zeros(t.shape, x.dtype)
        .at[jnp.arange(t.shape[0])[:, None], jnp.where(valid, t, c)]
        .set(1, mode="drop")
    )
    if unbatched:
        is_target = is_target[0]
    return _multilabel_margin_loss(x, target, is_target, reduction), is_target
