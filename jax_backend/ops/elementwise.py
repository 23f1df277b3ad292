"""Elementwise lowerings: arithmetic, comparisons, logic, activations.

Torch's type promotion is applied explicitly (``_common.promote``): operands are cast to the
common dtype before the JAX op, so each lowering computes in the dtype torch computes in.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import torch
from jax import lax

from jax_backend import dtypes
from jax_backend.errors import CstorchValueError
from jax_backend.ops._common import (
    as_float,
    opmath_dtype,
    promote,
    promote_to_float,
)
from jax_backend.registry import lowers

aten = torch.ops.aten


# ---------------------------------------------------------------------------- unary, float out
# Integer and bool inputs are computed in float32, as torch does for these functions.
_UNARY_FLOAT = {
    aten.exp.default: jnp.exp,
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log1p.default: jnp.log1p,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh,
    aten.erf.default: jax.scipy.special.erf,
    aten.erfc.default: jax.scipy.special.erfc,
    aten.erfinv.default: jax.scipy.special.erfinv,
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.lgamma.default: jax.scipy.special.gammaln,
    aten.digamma.default: jax.scipy.special.digamma,
    aten.i0.default: jax.scipy.special.i0,
    aten.special_i0e.default: jax.scipy.special.i0e,
    aten.special_i1.default: jax.scipy.special.i1,
    aten.special_i1e.default: jax.scipy.special.i1e,
    aten.special_ndtri.default: jax.scipy.special.ndtri,
    aten.special_erfcx.default: jax.scipy.special.erfcx
    if hasattr(jax.scipy.special, "erfcx")
    else None,
    aten.sinc.default: jnp.sinc,
    aten.deg2rad.default: jnp.deg2rad,
    aten.rad2deg.default: jnp.rad2deg,
}


def _register_unary_float(op, fn):
    @lowers(op)
    def lowering(x):
        return fn(as_float(x))

    lowering.__name__ = f"aten_{op.__name__.split('.')[0]}"


for _op, _fn in _UNARY_FLOAT.items():
    if _fn is not None:
        _register_unary_float(_op, _fn)


@lowers(aten.reciprocal.default)
def aten_reciprocal(x):
    x = as_float(x)
    return jnp.ones((), x.dtype) / x


@lowers(aten.logit.default)
def aten_logit(x, eps=None):
    x = as_float(x)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


# ---------------------------------------------------------------------- unary, dtype preserving
@lowers(aten.abs.default)
def aten_abs(x):
    return x if x.dtype == jnp.bool_ else jnp.abs(x)


@lowers(aten.neg.default, aten._neg_view.default, aten._neg_view_copy.default)
def aten_neg(x):  # a lazy negated view is materialised when taken
    return jnp.negative(x)


@lowers(aten.sign.default)
def aten_sign(x):
    return x if x.dtype == jnp.bool_ else jnp.sign(x)


@lowers(aten.sgn.default)
def aten_sgn(x):
    if jnp.iscomplexobj(x):
        mag = jnp.abs(x)
        return jnp.where(mag == 0, 0, x / jnp.where(mag == 0, 1, mag)).astype(x.dtype)
    return aten_sign(x)


def _integer_passthrough(fn):
    def lowering(x):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            return x
        return fn(x)

    return lowering


lowers(aten.ceil.default)(_integer_passthrough(jnp.ceil))
lowers(aten.floor.default)(_integer_passthrough(jnp.floor))
lowers(aten.trunc.default)(_integer_passthrough(jnp.trunc))
lowers(aten.round.default)(_integer_passthrough(jnp.round))


@lowers(aten.round.decimals)
def aten_round_decimals(x, decimals=0):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    return jnp.round(x, decimals)


@lowers(aten.frac.default)
def aten_frac(x):
    return x - jnp.trunc(x)


@lowers(aten.relu.default)
def aten_relu(x):
    if x.dtype == jnp.bool_:
        return x
    return jnp.maximum(x, jnp.zeros((), x.dtype))


@lowers(aten.isnan.default)
def aten_isnan(x):
    return jnp.isnan(x)


@lowers(aten.isinf.default)
def aten_isinf(x):
    return jnp.isinf(x)


@lowers(aten.isfinite.default)
def aten_isfinite(x):
    return jnp.isfinite(x)


@lowers(aten.isposinf.default)
def aten_isposinf(x):
    return jnp.isposinf(x)


@lowers(aten.isneginf.default)
def aten_isneginf(x):
    return jnp.isneginf(x)


@lowers(aten.signbit.default)
def aten_signbit(x):
    return jnp.signbit(x)


@lowers(aten.logical_not.default)
def aten_logical_not(x):
    return jnp.logical_not(x)


@lowers(aten.bitwise_not.default)
def aten_bitwise_not(x):
    return jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.bitwise_not(x)


@lowers(aten.nan_to_num.default)
def aten_nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@lowers(aten.conj_physical.default, aten._conj_physical.default)
def aten_conj_physical(x):
    return jnp.conj(x)


@lowers(aten.real.default)
def aten_real(x):
    return jnp.real(x)


@lowers(aten.imag.default)
def aten_imag(x):
    return jnp.imag(x)


# -------------------------------------------------------------------------------- arithmetic
def _scaled(other, alpha):
    # alpha may be a runtime scalar (jax_backend.scalars): only a Python 1 is skipped
    return (
        other
        if alpha is None or (isinstance(alpha, (int, float)) and alpha == 1)
        else other * alpha
    )


@lowers(aten.add.Tensor, aten.add.Scalar)
def aten_add(x, other, alpha=1):
    x, other = promote(x, other)
    if x.dtype == jnp.bool_:
        return jnp.logical_or(x, other)
    return x + _scaled(other, alpha)


@lowers(aten.sub.Tensor, aten.sub.Scalar)
def aten_sub(x, other, alpha=1):
    x, other = promote(x, other)
    return x - _scaled(other, alpha)


@lowers(aten.rsub.Tensor, aten.rsub.Scalar)
def aten_rsub(x, other, alpha=1):
    x, other = promote(x, other)
    return other - _scaled(x, alpha)


@lowers(aten.mul.Tensor, aten.mul.Scalar)
def aten_mul(x, other):
    x, other = promote(x, other)
    if x.dtype == jnp.bool_:
        return jnp.logical_and(x, other)
    return x * other


def _true_divide(x, other):
    x, other = promote_to_float(x, other)
    return x / other


def _floor_divide(x, other):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.floor_divide(x, other)
    # c10::div_floor_floating: the quotient rebuilt from fmod, so results match torch exactly.
    mod = jnp.fmod(x, other)
    div = (x - mod) / other
    div = jnp.where((mod != 0) & ((other < 0) != (mod < 0)), div - 1, div)
    floor = jnp.floor(div)
    floor = jnp.where(div - floor > 0.5, floor + 1, floor)
    signed_zero = jnp.copysign(jnp.zeros_like(div), x / other)
    return jnp.where(other == 0, x / other, jnp.where(div != 0, floor, signed_zero))


def _divide(x, other, rounding_mode):
    if rounding_mode is None:
        return _true_divide(x, other)
    x, other = promote(x, other)
    if rounding_mode == "trunc":
        if jnp.issubdtype(x.dtype, jnp.integer):
            return lax.div(x, other)
        return jnp.trunc(x / other)
    if rounding_mode == "floor":
        return _floor_divide(x, other)
    raise CstorchValueError(
        f"div expected rounding_mode to be one of None, 'trunc', or 'floor', got {rounding_mode!r}"
    )


@lowers(aten.div.Tensor, aten.div.Scalar)
def aten_div(x, other):
    return _true_divide(x, other)


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def aten_div_mode(x, other, rounding_mode=None):
    return _divide(x, other, rounding_mode)


@lowers(aten.floor_divide.default, aten.floor_divide.Scalar)
def aten_floor_divide(x, other):
    return _divide(x, other, "floor")


@lowers(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def aten_remainder(x, other):
    x, other = promote(x, other)
    return jnp.remainder(x, other)


@lowers(aten.fmod.Tensor, aten.fmod.Scalar)
def aten_fmod(x, other):
    x, other = promote(x, other)
    return jnp.fmod(x, other)


def _pow_scalar_exponent(x, exponent):
    # torch's CPU kernel special-cases these exponents; matching them keeps results bit-equal.
    if exponent == 2:
        return x * x
    if exponent == 3:
        return x * x * x
    if jnp.issubdtype(x.dtype, jnp.inexact):
        if exponent == 0.5:
            return jnp.sqrt(x)
        if exponent == -0.5:
            return lax.rsqrt(x)
        if exponent == -1:
            return jnp.ones((), x.dtype) / x
        if exponent == -2:
            return jnp.ones((), x.dtype) / (x * x)
    if isinstance(exponent, int) or float(exponent).is_integer() and abs(exponent) < 2**31:
        if jnp.issubdtype(x.dtype, jnp.integer) and exponent < 0:
            return jnp.power(x, jnp.asarray(int(exponent), x.dtype))
        return lax.integer_pow(x, int(exponent))
    return jnp.power(x, jnp.asarray(exponent, x.dtype))


@lowers(aten.pow.Tensor_Scalar)
def aten_pow_tensor_scalar(x, exponent):
    (x,) = promote(x, exponent)[:1]
    return _pow_scalar_exponent(x, exponent)


@lowers(aten.pow.Tensor_Tensor)
def aten_pow_tensor_tensor(x, exponent):
    x, exponent = promote(x, exponent)
    return jnp.power(x, exponent)


@lowers(aten.pow.Scalar)
def aten_pow_scalar(base, exponent):
    base, exponent = promote(base, exponent)
    return jnp.power(base, exponent)


@lowers(aten.atan2.default)
def aten_atan2(x, other):
    x, other = promote_to_float(x, other)
    return jnp.arctan2(x, other)


@lowers(aten.hypot.default)
def aten_hypot(x, other):
    x, other = promote(x, other)
    return jnp.hypot(x, other)


@lowers(aten.copysign.Tensor, aten.copysign.Scalar)
def aten_copysign(x, other):
    x, other = promote_to_float(x, other)
    return jnp.copysign(x, other)


@lowers(aten.nextafter.default)
def aten_nextafter(x, other):
    x, other = promote(x, other)
    return jnp.nextafter(x, other)


@lowers(aten.logaddexp.default)
def aten_logaddexp(x, other):
    x, other = promote_to_float(x, other)
    return jnp.logaddexp(x, other)


@lowers(aten.logaddexp2.default)
def aten_logaddexp2(x, other):
    x, other = promote_to_float(x, other)
    return jnp.logaddexp2(x, other)


@lowers(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)
def aten_xlogy(x, other):
    x, other = promote_to_float(x, other)
    return jax.scipy.special.xlogy(x, other)


@lowers(aten.special_xlog1py.default)
def aten_xlog1py(x, other):
    x, other = promote_to_float(x, other)
    return jax.scipy.special.xlog1py(x, other)


@lowers(aten.heaviside.default)
def aten_heaviside(x, values):
    x, values = promote(x, values)
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))


@lowers(aten.maximum.default)
def aten_maximum(x, other):
    x, other = promote(x, other)
    return jnp.maximum(x, other)


@lowers(aten.minimum.default)
def aten_minimum(x, other):
    x, other = promote(x, other)
    return jnp.minimum(x, other)


@lowers(aten.fmax.default)
def aten_fmax(x, other):
    x, other = promote(x, other)
    return jnp.fmax(x, other)


@lowers(aten.fmin.default)
def aten_fmin(x, other):
    x, other = promote(x, other)
    return jnp.fmin(x, other)


@lowers(aten.clamp.default, aten.clamp.Tensor)
def aten_clamp(x, min=None, max=None):
    x, lo, hi = promote(x, min, max)
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor)
def aten_clamp_min(x, min):
    return aten_clamp(x, min, None)


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor)
def aten_clamp_max(x, max):
    return aten_clamp(x, None, max)


@lowers(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def aten_where(condition, x, other):
    x, other = promote(x, other)
    return jnp.where(condition, x, other)


# ------------------------------------------------------------------------------- comparisons
def _comparison(fn):
    def lowering(x, other):
        x, other = promote(x, other)
        return fn(x, other)

    return lowering


_COMPARISONS: list[tuple[str, Callable]] = [
    ("eq", jnp.equal),
    ("ne", jnp.not_equal),
    ("lt", jnp.less),
    ("le", jnp.less_equal),
    ("gt", jnp.greater),
    ("ge", jnp.greater_equal),
]
for _name, _fn in _COMPARISONS:
    _packet = getattr(aten, _name)
    lowers(_packet.Tensor, _packet.Scalar)(_comparison(_fn))


@lowers(aten.logical_and.default)
def aten_logical_and(x, other):
    return jnp.logical_and(x, other)


@lowers(aten.logical_or.default)
def aten_logical_or(x, other):
    return jnp.logical_or(x, other)


@lowers(aten.logical_xor.default)
def aten_logical_xor(x, other):
    return jnp.logical_xor(x, other)


def _bitwise(fn):
    def lowering(x, other):
        x, other = promote(x, other)
        return fn(x, other)

    return lowering


lowers(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor)(
    _bitwise(jnp.bitwise_and)
)
lowers(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor)(
    _bitwise(jnp.bitwise_or)
)
lowers(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor)(
    _bitwise(jnp.bitwise_xor)
)
lowers(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar)(
    _bitwise(jnp.left_shift)
)
lowers(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar)(
    _bitwise(jnp.right_shift)
)


# ------------------------------------------------------------------------------- activations
def _in(dtype, *operands):
    """``operands`` in ``dtype``; a Python number stays one (a weak scalar of that dtype)."""
    return [a.astype(dtype) if isinstance(a, jax.Array) else a for a in operands]


def _float_of_first(x, *_):
    return dtypes.float_dtype_for(x.dtype)


def _in_opmath(result=dtypes.result_jax_dtype):
    """A lowering computed as torch's kernels compute half precision (their "opmath" type):
    its array operands (positional) in float32 for a half ``result(*operands)`` dtype, the
    result rounded once to that dtype, so the lowering need not. A formula of several steps in
    bfloat16 would round after each, giving other numbers than torch's, and XLA's CPU code
    converts at every one (a bf16 GELU over 2048x1024 took 1.4 ms that way)."""

    def decorate(fn):
        @functools.wraps(fn)
        def lowering(*operands, **kwargs):
            dtype = result(*operands)
            return fn(*_in(opmath_dtype(dtype), *operands), **kwargs).astype(dtype)

        return lowering

    return decorate


#: Activations: ``x``'s dtype, a float one for integer ``x``.
_activation_in_opmath = _in_opmath(_float_of_first)


@lowers(aten.gelu.default)
@_activation_in_opmath
def aten_gelu(x, approximate="none"):
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + jnp.tanh(inner))
    return x * 0.5 * (1.0 + jax.scipy.special.erf(x * (1.0 / math.sqrt(2.0))))


# The C library's M_SQRT2, M_SQRT1_2 and M_2_SQRTPI, which torch's GELU kernels use.
_SQRT2, _SQRT1_2, _2_SQRTPI = 1.41421356237309504880, 0.70710678118654752440, 1.12837916709551257390


# - func: gelu_backward(Tensor grad_output, Tensor self, *, str approximate='none') -> Tensor
@lowers(aten.gelu_backward.default)
@_in_opmath()
def aten_gelu_backward(g, x, *, approximate="none"):
    """torch's formula (its CPU kernel's and its decomposition's)."""
    if approximate == "tanh":
        beta = _SQRT2 * _2_SQRTPI * 0.5
        kappa = 0.044715
        x_sq = x * x
        inner = beta * (x + kappa * (x_sq * x))
        tanh_inner = jnp.tanh(inner)
        left_derivative = 0.5 * (1 + tanh_inner)
        inner_derivative = beta * (1 + 3 * kappa * x_sq)
        right_derivative = (0.5 * x) * (1 - tanh_inner * tanh_inner) * inner_derivative
        return g * (left_derivative + right_derivative)
    cdf = 0.5 * (1 + jax.scipy.special.erf(x * _SQRT1_2))
    pdf = _2_SQRTPI * _SQRT1_2 * 0.5 * jnp.exp(x * x * -0.5)
    return g * (cdf + x * pdf)


@lowers(aten.elu.default)
@_activation_in_opmath
def aten_elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    negative = scale * alpha * jnp.expm1(x * input_scale)
    return jnp.where(x > 0, x * scale, negative)


@lowers(aten.leaky_relu.default)
def aten_leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope).astype(x.dtype)


@lowers(aten.hardtanh.default)
def aten_hardtanh(x, min_val=-1.0, max_val=1.0):
    return jnp.clip(x, min_val, max_val).astype(x.dtype)


@lowers(aten.softplus.default)
@_activation_in_opmath
def aten_softplus(x, beta=1.0, threshold=20.0):
    scaled = x * beta
    soft = jnp.log1p(jnp.exp(jnp.minimum(scaled, threshold))) / beta
    return jnp.where(scaled > threshold, x, soft)


@lowers(aten.prelu.default, aten._prelu_kernel.default)
def aten_prelu(x, weight):
    if weight.ndim == 1 and x.ndim >= 2:
        weight = weight.reshape((1, -1) + (1,) * (x.ndim - 2))
    return jnp.where(x > 0, x, weight * x).astype(x.dtype)


@lowers(aten.mish.default)
@_activation_in_opmath
def aten_mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


@lowers(aten.silu.default)
@_activation_in_opmath
def aten_silu(x):
    return x * jax.nn.sigmoid(x)


@lowers(aten.hardsigmoid.default)
@_activation_in_opmath
def aten_hardsigmoid(x):
    return jnp.clip(x + 3.0, 0.0, 6.0) / 6.0


@lowers(aten.hardswish.default)
@_activation_in_opmath
def aten_hardswish(x):
    return x * jnp.clip(x + 3.0, 0.0, 6.0) / 6.0


@lowers(aten.threshold.default)
def aten_threshold(x, threshold, value):
    return jnp.where(x > threshold, x, jnp.asarray(value, x.dtype))


@lowers(aten.threshold_backward.default)
def aten_threshold_backward(grad, x, threshold):
    return jnp.where(x > threshold, grad, jnp.zeros((), grad.dtype))


# lerp, addcmul and addcdiv are kept whole by the capture (capture.WHOLE_OPS): torch's
# multi-tensor optimizers apply them to every parameter, and their decompositions cost ~2-9 ms
# of tracing each. Each is torch's formula in its order of operations (that of its CPU kernel
# and its decomposition), computed in float32 for half operands and rounded once, as both do.
@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
@_in_opmath()
def aten_lerp(x, end, weight):
    # For |w| < 0.5 it starts from x, otherwise from end (better accuracy); a Python weight
    # (an optimizer's 1 - beta) picks its side here, leaving XLA one formula.
    def from_x():
        return x + weight * (end - x)

    def from_end():
        return end - (end - x) * (1 - weight)

    if not isinstance(weight, jax.Array):
        return from_x() if abs(weight) < 0.5 else from_end()
    return jnp.where(jnp.abs(weight) < 0.5, from_x(), from_end())


@lowers(aten.addcmul.default)
@_in_opmath()
def aten_addcmul(x, tensor1, tensor2, *, value=1):
    return x + value * tensor1 * tensor2


@lowers(aten.addcdiv.default)
@_in_opmath(lambda *operands: dtypes.float_dtype_for(dtypes.result_jax_dtype(*operands)))
def aten_addcdiv(x, tensor1, tensor2, *, value=1):
    return x + value * tensor1 / tensor2


@lowers(aten.complex.default)
def aten_complex(real, imag):
    real, imag = jnp.broadcast_arrays(*promote(real, imag))
    return lax.complex(real, imag)


@lowers(aten.polar.default)
def aten_polar(magnitude, angle):
    magnitude, angle = jnp.broadcast_arrays(*promote(magnitude, angle))
    return lax.complex(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle))


@lowers(aten.frexp.Tensor)
def aten_frexp(x):
    mantissa, exponent = jnp.frexp(x)
    return mantissa, exponent.astype(jnp.int32)


@lowers(aten.ldexp.Tensor)
def aten_ldexp(x, other):
    x, other = promote_to_float(x, other)
    return x * jnp.exp2(other)


@lowers(aten.angle.default)
def aten_angle(x):
    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    x = as_float(x)
    return jnp.where(
        jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(math.pi, x.dtype), jnp.zeros((), x.dtype))
    )


@lowers(aten.hardshrink_backward.default, aten.softshrink_backward.default)
def aten_shrink_backward(grad_out, x, lambd):
    inside = (x >= -lambd) & (x <= lambd)
    return jnp.where(inside, jnp.zeros((), grad_out.dtype), grad_out)
