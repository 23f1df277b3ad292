"""Random lowerings. Each receives a fresh PRNG key (``key=``) derived from the program's RNG
state, so draws are deterministic for a seed and differ from step to step. The streams are
JAX's, not torch's: values differ from eager torch, their distributions do not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from jax_backend import dtypes
from jax_backend.ops._common import jax_dtype
from jax_backend.registry import lowers

aten = torch.ops.aten


def _float(dtype):
    return jax_dtype(dtype, dtypes.to_jax_dtype(torch.get_default_dtype()))


def _sample_dtype(dtype):
    """Sample in float32 at least: bf16/fp16 draws would be too coarse (uniform near 1)."""
    return dtype if jnp.finfo(dtype).bits >= 32 else jnp.dtype(jnp.float32)


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    sample_dtype = _sample_dtype(dtype)
    return jax.random.uniform(key, tuple(shape), sample_dtype, low, high).astype(dtype)


def _normal(key, shape, dtype):
    sample_dtype = _sample_dtype(dtype)
    return jax.random.normal(key, tuple(shape), sample_dtype).astype(dtype)


@lowers(aten.rand.default, aten.rand.generator, random=True)
def aten_rand(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _uniform(key, size, _float(dtype))


@lowers(aten.randn.default, aten.randn.generator, random=True)
def aten_randn(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _normal(key, size, _float(dtype))


@lowers(aten.rand_like.default, random=True)
def aten_rand_like(
    x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    return _uniform(key, x.shape, jax_dtype(dtype, x.dtype))


@lowers(aten.randn_like.default, random=True)
def aten_randn_like(
    x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    return _normal(key, x.shape, jax_dtype(dtype, x.dtype))


@lowers(aten.uniform.default, random=True)
def aten_uniform(x, from_=0.0, to=1.0, *, generator=None, key):
    return _uniform(key, x.shape, x.dtype, from_, to)


@lowers(aten.normal_functional.default, random=True)
def aten_normal_functional(x, mean=0.0, std=1.0, *, generator=None, key):
    return (_normal(key, x.shape, x.dtype) * std + mean).astype(x.dtype)


@lowers(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True)
def aten_normal(mean, std=1.0, *, generator=None, key):
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dtype = mean.dtype if hasattr(mean, "dtype") else std.dtype
    return (_normal(key, shape, dtype) * std + mean).astype(dtype)


@lowers(aten.normal.float_float, random=True)
def aten_normal_float_float(
    mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key
):
    dtype = _float(dtype)
    return (_normal(key, size, dtype) * std + mean).astype(dtype)


@lowers(aten.exponential.default, random=True)
def aten_exponential(x, lambd=1.0, *, generator=None, key):
    return (jax.random.exponential(key, x.shape, _sample_dtype(x.dtype)) / lambd).astype(x.dtype)


@lowers(aten.bernoulli.default, random=True)
def aten_bernoulli(x, *, generator=None, key):
    return (_uniform(key, x.shape, jnp.float32) < x.astype(jnp.float32)).astype(x.dtype)


@lowers(aten.bernoulli.p, random=True)
def aten_bernoulli_p(x, p=0.5, *, generator=None, key):
    return (_uniform(key, x.shape, jnp.float32) < p).astype(x.dtype)


@lowers(aten.bernoulli.Tensor, random=True)
def aten_bernoulli_tensor(x, p, *, generator=None, key):
    return (_uniform(key, x.shape, jnp.float32) < p.astype(jnp.float32)).astype(x.dtype)


@lowers(aten.native_dropout.default, random=True)
def aten_native_dropout(x, p, train, *, key):
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = _uniform(key, x.shape, jnp.float32) >= p
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype)).astype(x.dtype), keep


@lowers(aten.randint.low, aten.randint.low_generator, random=True)
def aten_randint_low(
    low, high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key
):
    return jax.random.randint(key, tuple(size), low, high, jnp.int64).astype(
        jax_dtype(dtype, jnp.int64)
    )


@lowers(aten.randint.default, aten.randint.generator, random=True)
def aten_randint(
    high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key
):
    return aten_randint_low(0, high, size, dtype=dtype, key=key)


@lowers(aten.randint_like.default, random=True)
def aten_randint_like(
    x, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    return jax.random.randint(key, x.shape, 0, high, jnp.int64).astype(jax_dtype(dtype, x.dtype))


@lowers(aten.randint_like.low_dtype, random=True)
def aten_randint_like_low(
    x, low, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    return jax.random.randint(key, x.shape, low, high, jnp.int64).astype(jax_dtype(dtype, x.dtype))


@lowers(getattr(aten.random, "from"), random=True)  # "from" is a Python keyword
def aten_random_from(x, from_, to=None, *, generator=None, key):
    high = (
        to
        if to is not None
        else (2**24 if jnp.issubdtype(x.dtype, jnp.floating) else int(jnp.iinfo(x.dtype).max))
    )
    return jax.random.randint(key, x.shape, from_, high, jnp.int64).astype(x.dtype)


@lowers(aten.random.to, random=True)
def aten_random_to(x, to, *, generator=None, key):
    return aten_random_from(x, 0, to, key=key)


@lowers(aten.random.default, random=True)
def aten_random(x, *, generator=None, key):
    return aten_random_from(x, 0, None, key=key)


@lowers(aten.randperm.default, aten.randperm.generator, random=True)
def aten_randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return jax.random.permutation(key, n).astype(jax_dtype(dtype, jnp.int64))


@lowers(aten.multinomial.default, random=True)
def aten_multinomial(probs, num_samples, replacement=False, *, generator=None, key):
    logits = jnp.log(probs.astype(jnp.float32))
    batch = logits.shape[:-1]
    if replacement:
        draws = jax.random.categorical(key, logits, axis=-1, shape=(num_samples,) + batch)
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int64)
    # Without replacement: Gumbel top-k draws categories in proportion to their weights.
    gumbel = jax.random.gumbel(key, logits.shape, jnp.float32)
    _, idx = jax.lax.top_k(logits + gumbel, num_samples)
    return idx.astype(jnp.int64)


@lowers(aten.cauchy.default, random=True)
def aten_cauchy(x, median=0.0, sigma=1.0, *, generator=None, key):
    u = _uniform(key, x.shape, _sample_dtype(x.dtype))
    return (median + sigma * jnp.tan(jnp.pi * (u - 0.5))).astype(x.dtype)


@lowers(aten.log_normal.default, random=True)
def aten_log_normal(x, mean=1.0, std=2.0, *, generator=None, key):
    z = _normal(key, x.shape, _sample_dtype(x.dtype))
    return jnp.exp(z * std + mean).astype(x.dtype)


@lowers(aten.geometric.default, random=True)
def aten_geometric(x, p, *, generator=None, key):
    """The number of Bernoulli(p) trials up to the first success (support 1, 2, ...)."""
    u = jax.random.uniform(key, x.shape, jnp.float32, minval=jnp.finfo(jnp.float32).tiny)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-p)).astype(x.dtype)


# - func: rrelu_with_noise_functional(Tensor self, Tensor noise, Scalar lower=0.125,
#   Scalar upper=0.3333333333333333, bool training=False, Generator? generator=None)
#   -> (Tensor, Tensor noise_out)
@lowers(aten.rrelu_with_noise_functional.default, random=True)
def aten_rrelu_with_noise_functional(
    x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None, *, key
):
    if not training:
        slope = (lower + upper) / 2
        return jnp.where(x >= 0, x, x * slope).astype(x.dtype), noise
    slope = _uniform(key, x.shape, x.dtype, lower, upper)
    negative = x < 0
    out = jnp.where(negative, x * slope, x).astype(x.dtype)
    new_noise = jnp.where(negative, slope, jnp.ones((), x.dtype)).astype(noise.dtype)
    return out, new_noise


@lowers(aten.rrelu_with_noise_backward.default)
def aten_rrelu_with_noise_backward(grad_output, x, noise, lower, upper, training, self_is_result):
    if training and upper - lower > 1e-6:
        return (grad_output * noise).astype(grad_output.dtype)
    slope = (lower + upper) / 2
    return jnp.where(x > 0, grad_output, grad_output * slope).astype(grad_output.dtype)
