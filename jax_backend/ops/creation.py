"""Tensor factories. ``empty`` is lowered as zeros: a static graph has no uninitialised memory."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from jax_backend import dtypes
from jax_backend.ops._common import jax_dtype
from jax_backend.registry import lowers

aten = torch.ops.aten


def _scalar_dtype(value):
    """The dtype torch infers for a factory filled with a Python scalar."""
    if isinstance(value, bool):
        return jnp.bool_
    if isinstance(value, int):
        return jnp.int64
    if isinstance(value, complex):
        return jnp.complex64
    return dtypes.to_jax_dtype(torch.get_default_dtype())


def _default_float():
    return dtypes.to_jax_dtype(torch.get_default_dtype())


@lowers(aten.full.default)
def aten_full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, jax_dtype(dtype, _scalar_dtype(fill_value)))


@lowers(aten.full_like.default)
def aten_full_like(
    x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    return jnp.full(x.shape, fill_value, jax_dtype(dtype, x.dtype))


@lowers(aten.zeros.default, aten._efficientzerotensor.default)
def aten_zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), jax_dtype(dtype, _default_float()))


@lowers(aten.ones.default)
def aten_ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), jax_dtype(dtype, _default_float()))


@lowers(aten.empty.memory_format)
def aten_empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(tuple(size), jax_dtype(dtype, _default_float()))


@lowers(aten.empty_strided.default)
def aten_empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), jax_dtype(dtype, _default_float()))


@lowers(aten.empty_permuted.default)
def aten_empty_permuted(
    size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None
):
    return jnp.zeros(tuple(size), jax_dtype(dtype, _default_float()))


@lowers(aten.zeros_like.default, aten.empty_like.default)
def aten_zeros_like(
    x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    return jnp.zeros(x.shape, jax_dtype(dtype, x.dtype))


@lowers(aten.ones_like.default)
def aten_ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, jax_dtype(dtype, x.dtype))


@lowers(aten.new_empty.default, aten.new_zeros.default)
def aten_new_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), jax_dtype(dtype, x.dtype))


@lowers(aten.new_ones.default)
def aten_new_ones(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), jax_dtype(dtype, x.dtype))


@lowers(aten.new_full.default)
def aten_new_full(x, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, jax_dtype(dtype, x.dtype))


@lowers(aten.new_empty_strided.default)
def aten_new_empty_strided(
    x, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None
):
    return jnp.zeros(tuple(size), jax_dtype(dtype, x.dtype))


@lowers(aten.scalar_tensor.default)
def aten_scalar_tensor(value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(value, jax_dtype(dtype, _default_float()))


@lowers(aten.fill.Scalar, aten.fill.Tensor)
def aten_fill(x, value):
    return jnp.full(x.shape, jnp.asarray(value).astype(x.dtype), x.dtype)


@lowers(aten.zero.default)
def aten_zero(x):
    return jnp.zeros_like(x)


def _arange_dtype(start, end, step):
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step)):
        return jnp.int64
    return _default_float()


@lowers(aten.arange.start_step)
def aten_arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = jax_dtype(dtype, _arange_dtype(start, end, step))
    length = max(int(np.ceil((end - start) / step)), 0)
    if jnp.issubdtype(dtype, jnp.integer):
        return (start + step * lax.iota(jnp.int64, length)).astype(dtype)
    # torch accumulates in double before casting down.
    return (start + step * lax.iota(jnp.float64, length)).astype(dtype)


@lowers(aten.arange.default)
def aten_arange_end(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten_arange(0, end, 1, dtype=dtype)


@lowers(aten.arange.start)
def aten_arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten_arange(start, end, 1, dtype=dtype)


@lowers(aten.linspace.default)
def aten_linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.linspace(start, end, steps).astype(jax_dtype(dtype, _default_float()))


@lowers(aten.eye.default)
def aten_eye(n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, dtype=jax_dtype(dtype, _default_float()))


@lowers(aten.eye.m)
def aten_eye_m(n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=jax_dtype(dtype, _default_float()))
