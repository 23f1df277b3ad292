"""The engine's CPU layer norm: ``native_layer_norm`` and its backward as JAX FFI custom calls
(``native/layer_norm.cc``), a row's statistics and results computed in one loop nest while the
row is in the cache (``cpu_layer_norm="native"``, the default).

Why: XLA's CPU compiler splits a layer norm into a reduction per statistic (given to YNNPACK)
and an elementwise kernel per result, and its backward likewise: on ``bench_engine``'s
transformer about a dozen distinct kernels, each compiled on the step's first run and each a
pass over the activations, and a broadcast of the weight that two fusions share materialized
by a kernel of its own. Five layer norms' forward and backward on its [2048, 256] activations
take ~7.7 ms in XLA's kernels, ~2.0 ms in torch's (``benchmarks/cpu_results.md``).

The numbers: ``ops.normalization``'s lowering, operation by operation in float32, each
rounded on its own (the library is built with ``-ffp-contract=off``); a row's sums are added
in another order (16 partial sums, then a fixed tree), and the weight and bias gradients are
summed over fixed blocks of rows, then block by block: the same on every run whatever the
threads. ``tests/jax_backend/test_native_layer_norm.py`` compares both with eager torch.

Where: only in the engine's own program for one CPU device (``Target.native_ops``, which
``Program`` sets), for float32 inputs; an export, ``pure_function``, other platforms and
half-precision inputs keep the XLA lowering, so a torch-free artifact never names the custom
call. Where the library is not built for the running jaxlib, XLA's kernels run (``native``
falls back without a word, as the fused optimizer's does).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_backend import config, ffi_libraries, target

LIBRARY = ffi_libraries.LAYER_NORM
FORWARD_TARGET, BACKWARD_TARGET = (name for name, _ in LIBRARY.targets)


def wanted(platform: str, layout) -> bool:
    """Whether a program for ``platform`` (on one device when ``layout`` is None) runs its
    float32 layer norms natively: a CPU with one device, ``cpu_layer_norm`` "native" and the
    library built for this jaxlib."""
    return LIBRARY.wanted(platform, layout, config.cpu_layer_norm)


def applies(*arrays) -> bool:
    """Whether the current lowering may run a layer norm of ``arrays`` (its float32 operands;
    None for an absent weight or bias) natively (``Target.native_ops``)."""
    return "layer_norm" in target.current().native_ops and all(
        a is None or a.dtype == jnp.float32 for a in arrays
    )


def _affine(weight, bias, shape):
    """The weight and bias as the library takes them: flat, ones and zeros where absent."""
    size = math.prod(shape)
    w = jnp.ones((size,), jnp.float32) if weight is None else weight.reshape(size)
    b = jnp.zeros((size,), jnp.float32) if bias is None else bias.reshape(size)
    return w, b


def forward(x, normalized_shape, weight, bias, eps):
    """``(out, mean, rstd)`` of ``native_layer_norm`` on float32 ``x``, natively."""
    axis = x.ndim - len(normalized_shape)
    stats = jax.ShapeDtypeStruct(x.shape[:axis] + (1,) * len(normalized_shape), jnp.float32)
    w, b = _affine(weight, bias, x.shape[axis:])
    call = LIBRARY.call(FORWARD_TARGET, (jax.ShapeDtypeStruct(x.shape, jnp.float32), stats, stats))
    return tuple(call(x, w, b, eps=np.float32(eps)))


def backward(grad_out, x, normalized_shape, mean, rstd, weight):
    """``(grad_x, grad_weight, grad_bias)`` of ``native_layer_norm_backward`` on float32
    operands, natively (the caller drops those its output mask does not ask for)."""
    axis = x.ndim - len(normalized_shape)
    w, _ = _affine(weight, None, x.shape[axis:])
    flat = jax.ShapeDtypeStruct((w.shape[0],), jnp.float32)
    call = LIBRARY.call(BACKWARD_TARGET, (jax.ShapeDtypeStruct(x.shape, jnp.float32), flat, flat))
    grad_x, grad_w, grad_b = call(grad_out, x, mean, rstd, w)
    shape = x.shape[axis:]
    return grad_x, grad_w.reshape(shape), grad_b.reshape(shape)
