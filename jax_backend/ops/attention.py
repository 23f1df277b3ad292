"""Scaled dot-product attention: which implementation runs a call, and one definition shared
by torch's attention op and its backward op.

Implementations (``choose``):

* ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")``, cuDNN's fused flash
  attention (no score matrix in memory). NVIDIA GPUs only, and only for calls it computes as
  torch does: fp16/bf16, head dim a multiple of 8 up to 128, no dropout, no mask or an
  additive (float) one of shape ``(B|1, N|1, L, S)``, causal only where query and key lengths
  are equal (cuDNN's and torch's causal masks agree there). Boolean masks stay on XLA: a row
  with no key left reads NaN in torch, but cuDNN, which masks with a large negative number,
  would average the values.
* ``"xla"``: torch's math written out (``q kᵀ · scale`` with masks as ``-inf``, softmax in
  fp32, ``· v``), which XLA fuses. On CPU it runs no slower than ``jax.nn.
  dot_product_attention``'s XLA form (``bench_engine.py``'s 2-block transformer step, fp32
  and bf16, within the noise of a shared machine), which adds layout transposes and masks
  with a finite number instead of torch's ``-inf``; so it runs there.

``Target.attention`` (``CSTORCH_ATTENTION``) can rule cuDNN out ("xla") or ask for it ("cudnn":
the same rules, with a warning where a call cannot use it). Where cuDNN refuses anyway (at
trace time here; at compile time, ``Program`` compiles the step again with XLA's attention),
XLA's computes the call, with an ``AttentionFallbackWarning``.

Forward and backward: the captured graph holds torch's attention op and, separately, its
backward op. The forward lowering takes the JAX VJP of the implementation and leaves it in
the graph run's scratch space (``interpreter.run_scratch``); the backward op of the same call
picks it up, so the backward uses the forward's residuals (for cuDNN, the fused kernel's
softmax statistics feed the fused backward kernel, as in torch's flash attention) instead of
recomputing the forward. A backward without its forward in the graph recomputes it.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import torch

from jax_backend import target as target_module
from jax_backend.errors import CstorchNotImplementedError
from jax_backend.interpreter import run_scratch
from jax_backend.ops import layout_copy, linalg
from jax_backend.ops._common import dot_precision, dot_result_dtype
from jax_backend.registry import lowers
from jax_backend.user_frames import warn

aten = torch.ops.aten

_HALF = (jnp.float16, jnp.bfloat16)
CUDNN_MAX_HEAD_DIM = 128


class AttentionFallbackWarning(UserWarning):
    """cuDNN attention was chosen or asked for, but XLA's computes a call: cuDNN cannot be
    loaded or refuses it, or ``CSTORCH_ATTENTION=cudnn`` and the call is one it cannot run."""


def cudnn_unsupported(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0):
    """Why cuDNN's fused attention cannot compute this call as torch does (a sentence), or
    None when it can. ``q``/``k``/``v``/``attn_mask`` need only ``shape`` and ``dtype``."""
    if dropout_p:
        return "dropout is applied"
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        return "the inputs are not 4-D (batch, heads, length, head dim)"
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _HALF:
        return f"the dtype is {q.dtype}, not float16/bfloat16"
    (b, n, lq, e), (bk, nk, s, ek), (bv, nv, sv, ev) = q.shape, k.shape, v.shape
    if not (b == bk == bv) or nk != nv or s != sv:
        return "key and value do not match the query's batch or each other"
    if nk == 0 or n % nk:
        return "the query heads are not a multiple of the key/value heads"
    if not (e == ek == ev) or e % 8 or e > CUDNN_MAX_HEAD_DIM:
        return (
            f"head dims {e}/{ek}/{ev}: cuDNN needs equal head dims, a multiple of 8 up "
            f"to {CUDNN_MAX_HEAD_DIM}"
        )
    if is_causal and lq != s:
        return "causal attention with query length != key length"
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            return "the mask is boolean"
        shape = (1,) * (4 - len(attn_mask.shape)) + tuple(attn_mask.shape)
        if (
            len(shape) != 4
            or shape[0] not in (1, b)
            or shape[1] not in (1, n)
            or shape[2:] != (lq, s)
        ):
            return f"the mask's shape {tuple(attn_mask.shape)} is not (B|1, N|1, L, S)"
        if lq % 2 or s % 2:
            return "a mask with odd sequence lengths"
    return None


def choose(
    platform, q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0, setting="auto"
) -> str:
    """The implementation ("cudnn" or "xla") that runs this call on ``platform``."""
    if setting == "xla" or platform != "cuda":
        return "xla"
    reason = cudnn_unsupported(q, k, v, attn_mask, is_causal, dropout_p)
    if reason is None:
        return "cudnn"
    if setting == "cudnn":
        warnings.warn(
            f"CSTORCH_ATTENTION=cudnn, but this attention call runs on XLA: {reason}.",
            AttentionFallbackWarning,
            stacklevel=2,
        )
    return "xla"


# ------------------------------------------------------------------------------ the math
def _repeat_kv_heads(q, k, v):
    """Grouped-query attention (fewer key/value heads than query heads, as torch's CPU kernels
    accept without a flag in their backward): each key/value head serves its group."""
    if k.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        repeat = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, repeat, axis=-3), jnp.repeat(v, repeat, axis=-3)
    return k, v


def default_scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def scores(q, k, attn_mask, is_causal, scale):
    """q kᵀ · scale with the causal and explicit masks applied, in fp32 for half inputs (as
    torch's kernels keep them)."""
    accumulate = jnp.float32 if q.dtype in _HALF else None
    s = jnp.einsum(
        "...qd,...kd->...qk", q, k, precision=dot_precision(q, k), preferred_element_type=accumulate
    ) * default_scale(q, scale)
    if is_causal:
        lq, lk = q.shape[-2], k.shape[-2]
        s = jnp.where(jnp.tril(jnp.ones((lq, lk), jnp.bool_)), s, -jnp.inf)
    if attn_mask is not None:
        s = (
            jnp.where(attn_mask, s, -jnp.inf)
            if attn_mask.dtype == jnp.bool_
            else s + attn_mask.astype(s.dtype)
        )
    return s


def xla_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """softmax(q kᵀ · scale + mask) v, as torch's math backend computes it; the result has
    q's dtype (half products accumulate in fp32)."""
    k, v = _repeat_kv_heads(q, k, v)
    probs = jax.nn.softmax(scores(q, k, attn_mask, is_causal, scale), axis=-1).astype(v.dtype)
    out = jnp.einsum(
        "...qk,...kd->...qd",
        probs,
        v,
        precision=dot_precision(probs, v),
        preferred_element_type=dot_result_dtype(v.dtype),
    )
    return out.astype(q.dtype)


def cudnn_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """The same with cuDNN's fused kernel (torch's (B, N, L, E) layout in and out; cuDNN's
    output layout is already that, so the transposes cost nothing)."""
    bias = None
    if attn_mask is not None:
        bias = attn_mask.astype(q.dtype)
        bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
    out = jax.nn.dot_product_attention(
        jnp.swapaxes(q, 1, 2),
        jnp.swapaxes(k, 1, 2),
        jnp.swapaxes(v, 1, 2),
        bias=bias,
        scale=default_scale(q, scale),
        is_causal=is_causal,
        implementation="cudnn",
    )
    return jnp.swapaxes(out, 1, 2)


def logsumexp(q, k, attn_mask, is_causal, scale):
    """The fp32 log-sum-exp of each query's scores (the second output of torch's flash
    attention ops; unused by their backward here, so XLA drops it when nothing else reads
    it)."""
    k, _ = _repeat_kv_heads(q, k, k)
    return jax.nn.logsumexp(scores(q, k, attn_mask, is_causal, scale).astype(jnp.float32), axis=-1)


# ------------------------------------------------------------------ forward and backward
def _implementation(q, k, v, attn_mask, is_causal):
    current = target_module.current()
    name = choose(current.platform, q, k, v, attn_mask, is_causal, 0.0, current.attention)
    return cudnn_attention if name == "cudnn" else xla_attention


def _written_out(q, k, v) -> bool:
    """Whether ``_cpu_vjp`` computes this call: half inputs whose products accumulate in
    float32 (the CPU) or float32 inputs on the CPU, one key/value head per query head, no
    broadcast batch dims."""
    return (
        q.dtype == k.dtype == v.dtype
        and (
            (q.dtype in _HALF and dot_result_dtype(q.dtype) is not None)
            or (q.dtype == jnp.float32 and target_module.current().platform == "cpu")
        )
        and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
    )


def _cpu_vjp(q, k, v, attn_mask, is_causal, scale):
    """(output, VJP function) of ``xla_attention`` on the CPU, the backward written out
    instead of JAX's. For float32 it is JAX's formula (softmax's ``p·(g − Σ g·p)``) without
    ``jax.vjp``'s linearization, which was a quarter of a transformer's lowering, and of which
    XLA made five more distinct kernels (the same losses). For half inputs its products take
    the input dtype's operands, as torch's CPU flash attention's backward does (the score
    gradient rounded to the input dtype before the two products that read it), in the forms
    XLA's bfloat16 kernels run (``linalg.dot``: the transposed products through the engine's
    layout copy where the program has it); JAX's VJP widens all four products to float32
    (the cotangent arrives in float32). For bfloat16 in a program with the layout copy, the
    query, key, value and output gradient are first made row-major
    (``layout_copy.row_major``): split into heads by a transpose, they would have XLA widen
    the forward's two products and two of the backward's (float16 products are widened
    whatever the layout)."""
    copied = layout_copy.applies() and q.dtype == jnp.bfloat16
    if copied:
        q, k, v = layout_copy.row_major(q), layout_copy.row_major(k), layout_copy.row_major(v)
    p = jax.nn.softmax(scores(q, k, attn_mask, is_causal, scale), axis=-1)
    probs = p.astype(v.dtype)
    n = q.ndim
    batch = (tuple(range(n - 2)),) * 2
    out = linalg.dot(probs, v, ((n - 1,), (n - 2,)), batch)

    def vjp(grad_out):
        grad_out = grad_out.astype(v.dtype)
        if copied:
            grad_out = layout_copy.row_major(grad_out)
        grad_p = linalg.dot(grad_out, v, ((n - 1,), (n - 1,)), batch, rounded=False)
        grad_v = linalg.dot(probs, grad_out, ((n - 2,), (n - 2,)), batch)
        grad_s = p * (grad_p - jnp.sum(grad_p * p, axis=-1, keepdims=True))
        grad_s = (grad_s * default_scale(q, scale)).astype(q.dtype)
        grad_q = linalg.dot(grad_s, k, ((n - 1,), (n - 2,)), batch)
        grad_k = linalg.dot(grad_s, q, ((n - 2,), (n - 2,)), batch)
        return grad_q, grad_k, grad_v

    return out, vjp


def _vjp(q, k, v, attn_mask, is_causal, scale):
    """(output, VJP function) of the chosen implementation."""
    implementation = _implementation(q, k, v, attn_mask, is_causal)
    if implementation is xla_attention and _written_out(q, k, v):
        return _cpu_vjp(q, k, v, attn_mask, is_causal, scale)
    try:
        return jax.vjp(
            lambda q_, k_, v_: implementation(q_, k_, v_, attn_mask, is_causal, scale), q, k, v
        )
    except (NotImplementedError, RuntimeError, ValueError) as error:
        if implementation is xla_attention:
            raise
        # cuDNN's own checks refused (its version, the GPU's generation): XLA computes it.
        warn(
            f"cuDNN attention is not available here ({error}); XLA computes it.",
            AttentionFallbackWarning,
        )
    return jax.vjp(
        lambda q_, k_, v_: xla_attention(q_, k_, v_, attn_mask, is_causal, scale), q, k, v
    )


def forward(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """The attention output; its VJP is left for this call's backward op."""
    out, vjp = _vjp(q, k, v, attn_mask, is_causal, scale)
    run_scratch()[("attention", id(out))] = (out, q, k, v, vjp)
    return out


def backward(grad_out, q, k, v, out, attn_mask=None, is_causal=False, scale=None):
    """(grad q, grad k, grad v) of the call that produced ``out``."""
    saved = run_scratch().get(("attention", id(out)))
    if saved is not None and all(a is b for a, b in zip(saved[:4], (out, q, k, v))):
        vjp = saved[4]
    else:  # this call's forward is not in the graph: recompute it
        _, vjp = _vjp(q, k, v, attn_mask, is_causal, scale)
    return vjp(grad_out.astype(out.dtype))


# --------------------------------------------------------------------------- lowerings
@lowers(aten._scaled_dot_product_flash_attention_for_cpu.default)
def aten_sdpa_flash_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if dropout_p:
        raise CstorchNotImplementedError("flash attention with dropout_p > 0 is not lowered.")
    return (
        forward(q, k, v, attn_mask, is_causal, scale),
        logsumexp(q, k, attn_mask, is_causal, scale),
    )


@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def aten_sdpa_flash_cpu_backward(
    grad_out, q, k, v, out, logsumexp_, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    if dropout_p:
        raise CstorchNotImplementedError(
            "the CPU flash-attention backward with dropout_p > 0 cannot replay torch's dropout "
            "mask; use dropout_p=0 in scaled_dot_product_attention or a separate nn.Dropout."
        )
    return backward(grad_out, q, k, v, out, attn_mask, is_causal, scale)
