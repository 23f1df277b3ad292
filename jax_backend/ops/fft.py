"""Discrete Fourier transforms: the three primitive FFT ops that ``torch.fft`` lowers to.

Each primitive computes the unnormalised transform and then applies torch's ``normalization``
code (0: none, 1: 1/sqrt(n), 2: 1/n, with n the product of the signal sizes), so the
direction of the transform and its scaling stay independent, as in ATen.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from jax_backend.ops._common import canon_dim
from jax_backend.registry import lowers

aten = torch.ops.aten


def _scale(x, sizes, normalization):
    n = math.prod(sizes)
    if normalization == 0 or n == 0:
        return x
    factor = 1.0 / math.sqrt(n) if normalization == 1 else 1.0 / n
    return x * jnp.asarray(factor, x.dtype)  # a complex factor for complex x: no promotion


def _complex_dtype(dtype):
    return jnp.complex128 if dtype in (jnp.float64, jnp.complex128) else jnp.complex64


# - func: _fft_r2c(Tensor self, int[] dim, int normalization, bool onesided) -> Tensor
@lowers(aten._fft_r2c.default)
def aten_fft_r2c(x, dim, normalization, onesided):
    axes = tuple(canon_dim(d, x.ndim) for d in dim)
    if onesided:
        out = jnp.fft.rfftn(x, axes=axes, norm="backward")
    else:
        out = jnp.fft.fftn(x.astype(_complex_dtype(x.dtype)), axes=axes, norm="backward")
    return _scale(out, [x.shape[a] for a in axes], normalization).astype(_complex_dtype(x.dtype))


# - func: _fft_c2r(Tensor self, int[] dim, int normalization, SymInt last_dim_size) -> Tensor
@lowers(aten._fft_c2r.default)
def aten_fft_c2r(x, dim, normalization, last_dim_size):
    axes = tuple(canon_dim(d, x.ndim) for d in dim)
    sizes = [x.shape[a] for a in axes[:-1]] + [int(last_dim_size)]
    # norm="forward" leaves the inverse transform unscaled.
    out = jnp.fft.irfftn(x, s=sizes, axes=axes, norm="forward")
    return _scale(out, sizes, normalization)


# - func: _fft_c2c(Tensor self, SymInt[] dim, int normalization, bool forward) -> Tensor
@lowers(aten._fft_c2c.default)
def aten_fft_c2c(x, dim, normalization, forward):
    axes = tuple(canon_dim(d, x.ndim) for d in dim)
    if not axes:
        return x
    if forward:
        out = jnp.fft.fftn(x, axes=axes, norm="backward")
    else:
        out = jnp.fft.ifftn(x, axes=axes, norm="forward")
    return _scale(out, [x.shape[a] for a in axes], normalization).astype(x.dtype)
