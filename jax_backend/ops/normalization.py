"""Normalisation lowerings: layer norm, group norm and every batch-norm variant, forward and
backward. Statistics of half-precision inputs are computed in float32 (``compute_dtype``).

Core ATen decompositions turn most of these into elementwise ops before lowering; they are
lowered as well so that graphs captured without the decomposition table still run.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from jax_backend import native_layer_norm
from jax_backend.ops._common import compute_dtype
from jax_backend.registry import lowers

aten = torch.ops.aten


# ----------------------------------------------------------------------------- normalisation
@lowers(aten.native_layer_norm.default)
def aten_native_layer_norm(x, normalized_shape, weight, bias, eps):
    if native_layer_norm.applies(x, weight, bias):  # the engine's CPU program
        return native_layer_norm.forward(x, normalized_shape, weight, bias, eps)
    axis = x.ndim - len(normalized_shape)
    axes = tuple(range(axis, x.ndim))
    xc = x.astype(compute_dtype(x))
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
    xc = x.astype(compute_dtype(x)).reshape(n, group, (c // group) * hxw)
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
    xc = x.astype(compute_dtype(x))
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
    xc = x.astype(compute_dtype(x))
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
def aten_batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
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


# ------------------------------------------------------------------- normalisation backward
# Layer norm's is kept whole by the capture (capture.WHOLE_OPS); group norm's is
# decomposed by core_aten_decompositions, lowered too so graphs captured without it still run.
@lowers(aten.native_layer_norm_backward.default)
def aten_native_layer_norm_backward(
    grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask
):
    if native_layer_norm.applies(grad_out, x, mean, rstd, weight, bias):
        grads = native_layer_norm.backward(grad_out, x, normalized_shape, mean, rstd, weight)
        present = (True, weight is not None, bias is not None)
        return tuple(
            g if (want and ok) else None for g, want, ok in zip(grads, output_mask, present)
        )
    axis = x.ndim - len(normalized_shape)
    axes = tuple(range(axis, x.ndim))
    xc = x.astype(compute_dtype(x))
    xhat = (xc - mean) * rstd
    g = grad_out.astype(xc.dtype)
    gw = g * weight if weight is not None else g
    n = math.prod(x.shape[axis:])
    grad_x = None
    if output_mask[0]:
        grad_x = (rstd / n) * (
            n * gw
            - jnp.sum(gw, axes, keepdims=True)
            - xhat * jnp.sum(gw * xhat, axes, keepdims=True)
        )
        grad_x = grad_x.astype(x.dtype)
    lead = tuple(range(axis))
    grad_w = (
        jnp.sum(g * xhat, lead).astype(weight.dtype)
        if (output_mask[1] and weight is not None)
        else None
    )
    grad_b = jnp.sum(g, lead).astype(bias.dtype) if (output_mask[2] and bias is not None) else None
    return grad_x, grad_w, grad_b


@lowers(aten.native_group_norm_backward.default)
def aten_native_group_norm_backward(grad_out, x, mean, rstd, weight, n, c, hxw, group, output_mask):
    xc = x.astype(compute_dtype(x))
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
        grad_x = (r / m) * (
            m * gw_g
            - jnp.sum(gw_g, -1, keepdims=True)
            - xhat_g * jnp.sum(gw_g * xhat_g, -1, keepdims=True)
        )
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
def aten_batch_norm_with_update_functional(
    x, weight, bias, running_mean, running_var, momentum, eps
):
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
    xc = x.astype(compute_dtype(x))
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
def aten_native_batch_norm_backward(
    grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    if train:
        return _batch_norm_grads(grad_out, x, weight, save_mean, save_invstd, True, output_mask)
    invstd = lax.rsqrt(running_var.astype(compute_dtype(x)) + eps)
    return _batch_norm_grads(grad_out, x, weight, running_mean, invstd, False, output_mask)


@lowers(aten.batch_norm_backward.default)
def aten_batch_norm_backward(
    grad_out,
    x,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_var,
    update,
    eps,
    output_mask,
    reserve,
):
    train = update or running_mean is None
    return aten_native_batch_norm_backward(
        grad_out, x, weight, running_mean, running_var, save_mean, save_var, train, eps, output_mask
    )


# --------------------------------------------------------------------------- weight norm
# torch.nn.utils.weight_norm: w = g * v / ||v||, the norm taken over every dimension but
# ``dim`` (over all of them for dim=-1). The forward is decomposed by core ATen; lowered too,
# as its backward (which has no decomposition) is.
def _weight_norm_axes(v, dim):
    return tuple(i for i in range(v.ndim) if i != dim)


@lowers(aten._weight_norm_interface.default)
def aten_weight_norm_interface(v, g, dim=0):
    vc = v.astype(compute_dtype(v))
    norm = jnp.sqrt(jnp.sum(vc * vc, _weight_norm_axes(v, dim), keepdims=True))
    out = vc * (g.astype(vc.dtype) / norm)
    norm_dtype = jnp.float32 if g.dtype == jnp.bfloat16 else g.dtype
    return out.astype(v.dtype), norm.astype(norm_dtype)


@lowers(aten._weight_norm_interface_backward.default)
def aten_weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    dtype = compute_dtype(saved_v)
    v, g = saved_v.astype(dtype), saved_g.astype(dtype)
    norm, grad = saved_norms.astype(dtype), grad_w.astype(dtype)
    # dL/dg = <grad_w, v> / ||v||;  dL/dv = (g / ||v||) * (grad_w - v * dL/dg / ||v||)
    grad_g = jnp.sum(grad * v, _weight_norm_axes(v, dim), keepdims=True) / norm
    grad_v = (g / norm) * (grad - v * (grad_g / norm))
    return grad_v.astype(saved_v.dtype), grad_g.reshape(saved_g.shape).astype(saved_g.dtype)
