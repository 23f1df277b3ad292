"""Matrix products. fp32 dots run at full precision; half-precision dots accumulate in fp32."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from jax_backend.ops._common import accumulation_dtype, dot_precision, promote
from jax_backend.registry import lowers

aten = torch.ops.aten


def _dot(a, b, contracting, batch=((), ())):
    a, b = promote(a, b)
    out = lax.dot_general(
        a, b, (contracting, batch),
        precision=dot_precision(a, b),
        preferred_element_type=accumulation_dtype(a.dtype),
    )
    return out.astype(a.dtype)


def matmul_2d(a, b):
    return _dot(a, b, ((1,), (0,)))


def matmul_batched(a, b):
    return _dot(a, b, ((2,), (1,)), ((0,), (0,)))


def _scale_add(result, bias, beta, alpha):
    if alpha != 1:
        result = result * alpha
    if beta == 0:
        return result
    bias = bias.astype(result.dtype)
    return result + (bias if beta == 1 else bias * beta)


@lowers(aten.mm.default)
def aten_mm(a, b):
    return matmul_2d(a, b)


@lowers(aten.bmm.default)
def aten_bmm(a, b):
    return matmul_batched(a, b)


@lowers(aten.addmm.default)
def aten_addmm(bias, a, b, *, beta=1, alpha=1):
    return _scale_add(matmul_2d(a, b), bias, beta, alpha)


@lowers(aten.baddbmm.default)
def aten_baddbmm(bias, a, b, *, beta=1, alpha=1):
    return _scale_add(matmul_batched(a, b), bias, beta, alpha)


@lowers(aten.addbmm.default)
def aten_addbmm(bias, a, b, *, beta=1, alpha=1):
    return _scale_add(jnp.sum(matmul_batched(a, b), axis=0), bias, beta, alpha)


@lowers(aten.mv.default)
def aten_mv(a, v):
    return _dot(a, v, ((1,), (0,)))


@lowers(aten.addmv.default)
def aten_addmv(bias, a, v, *, beta=1, alpha=1):
    return _scale_add(aten_mv(a, v), bias, beta, alpha)


@lowers(aten.dot.default, aten.vdot.default)
def aten_dot(a, b):
    return _dot(a, b, ((0,), (0,)))


@lowers(aten.outer.default)
def aten_outer(a, b):
    a, b = promote(a, b)
    return a[:, None] * b[None, :]


@lowers(aten._cdist_forward.default)
def aten_cdist(x1, x2, p, compute_mode=None):
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum((a != 0).astype(x1.dtype), axis=-1)
    if p == float("inf"):
        return jnp.max(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if p == 1:
        return jnp.sum(a, axis=-1)
    return jnp.sum(a**p, axis=-1) ** (1.0 / p)
