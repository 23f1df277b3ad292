"""torch's own CPU kernels, called from a compiled CPU step: the convolutions
(``cpu_convolutions``) and the bfloat16 dots XLA computes in float32 (``cpu_half_dots``, at
the end).

XLA's CPU convolutions are far slower than torch's (oneDNN) on common shapes: on
pytorch/examples' MNIST network the weight gradient of the 32->64 convolution, which JAX
lowers as a convolution with a 24x24 window, takes XLA about six times the CPU time of
torch's ``convolution_backward`` (``benchmarks/cpu_results.md``). So a step the engine compiles for
the CPU and runs in its own process calls torch's kernels for every convolution and
convolution gradient instead: the same kernels eager torch runs, hence eager torch's numbers
(bit for bit in float32) at eager torch's speed.

How: by default (``cpu_convolutions="native"``) through the engine's FFI library
(``native/torch_convolutions.cc``, ``ffi_libraries.TORCH_CONVOLUTIONS``): a custom call that
runs ``aten::convolution``/``convolution_backward`` on XLA's buffers in place and writes each
result into XLA's. Otherwise (``"torch"``, or where that library is not built for the
running jaxlib and torch) through ``jax.pure_callback``: each operand reaches torch without a
copy (DLPack), each result is copied once into XLA's buffer, and JAX's callback machinery
(Python, the GIL, array conversions) costs about 2 ms a call on an MNIST-sized convolution
(forward 7.7 vs 9.2 ms, backward 15.3 vs 17.8, 2 Zen 4 cores).

Where: only in the engine's own program for one CPU device (``Target.torch_kernels``, the
kinds of op that ``Program`` sets from the settings, read when the program is built, and
``Target.native_kernels``, those called through the library). A GPU, a mesh of devices, an
export (the artifact runs without torch), ``pure_function`` (a JAX function the user may
transform) and the lowerings called directly keep the XLA lowering (``ops.nn``).

What it costs: JAX never writes a program with a host callback to its persistent compilation
cache (the callback belongs to the process), so such a step compiles again in every process;
a program calling the library names only its target, and is cached.

Dtypes: float32 and bfloat16 operands go to torch as they are: for bfloat16 (autocast's) its
oneDNN kernels accumulate in float32 and round the result once, eager autocast's own numbers,
at up to twice float32's speed where the CPU has bfloat16 instructions (an MNIST-shaped CNN's
bf16 step: 61 -> 39 ms on 2 Zen 4 cores). float16 operands are widened to float32 (exactly)
and the result rounded once, as the XLA lowering does on a CPU
(``ops._common.dot_result_dtype``); float64, complex and integer convolutions keep the XLA
lowering.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp
import numpy as np
import torch

from jax_backend import config, ffi_libraries, target
from jax_backend.errors import CstorchRuntimeError
from jax_backend.ops import layout_copy

aten = torch.ops.aten

# Operand dtypes torch's kernels serve here, and the dtype they are computed in.
_COMPUTED_IN = {
    jnp.dtype(jnp.float32): jnp.float32,
    jnp.dtype(jnp.bfloat16): jnp.bfloat16,
    jnp.dtype(jnp.float16): jnp.float32,
}


LIBRARY = ffi_libraries.TORCH_CONVOLUTIONS
_CONVOLUTION, _CONVOLUTION_BACKWARD = (name for name, _ in LIBRARY.targets)

# The count of ops lowered to torch's kernels in the current ``counting()`` block.
_lowered = contextvars.ContextVar("torch_kernel_ops_lowered", default=None)


@contextlib.contextmanager
def counting():
    """Counts the ops lowered to torch's kernels in the block (a program's trace): yields a
    one-element list whose item is that count after the block. The engine's pool keeps such a
    step's torch allocations only where there are some (``host_memory.keep_step_memory``)."""
    count = [0]
    token = _lowered.set(count)
    try:
        yield count
    finally:
        _lowered.reset(token)


def _lowering_one() -> None:
    count = _lowered.get()
    if count is not None:
        count[0] += 1


# The kinds of op a program may run on torch's kernels, each with the setting that asks for it.
KINDS = {"convolution": config.cpu_convolutions, "half_dot": config.cpu_half_dots}


def wanted(platform: str, layout) -> frozenset:
    """The kinds of op a program for ``platform`` (on one device when ``layout`` is None) runs
    on torch's kernels: those whose setting says ``torch`` or ``native``, on a CPU with one
    device; except the half dots under ``native``, which the engine's layout copy serves
    where it is built for this jaxlib (``layout_copy.unavailable``)."""
    if platform != "cpu" or layout is not None:
        return frozenset()

    def on_torch(kind, setting):
        if kind == "half_dot" and setting.value == "native":
            return layout_copy.unavailable() is not None
        return setting.value in ("torch", "native")

    return frozenset(kind for kind, setting in KINDS.items() if on_torch(kind, setting))


def called_natively(kinds: frozenset) -> frozenset:
    """Those of ``kinds`` (from ``wanted``) called through the engine's FFI library rather
    than host callbacks: the convolutions under ``cpu_convolutions="native"``, where the
    library is built for the running jaxlib and torch."""
    if "convolution" not in kinds or config.cpu_convolutions.value != "native":
        return frozenset()
    return frozenset({"convolution"}) if LIBRARY.unavailable() is None else frozenset()


def applies(*arrays, kind: str = "convolution") -> bool:
    """Whether the current lowering calls torch's kernels for an op of ``kind`` on ``arrays``
    (None: an absent operand)."""
    if kind not in target.current().torch_kernels:
        return False
    dtypes = {jnp.dtype(a.dtype) for a in arrays if a is not None}
    return len(dtypes) == 1 and dtypes <= _COMPUTED_IN.keys()


def _to_torch(value) -> torch.Tensor:
    """A callback operand as a torch tensor, without a copy where JAX hands over an array
    (DLPack); a read-only numpy array (older JAX) is copied, as torch cannot wrap one. numpy
    has no bfloat16 of its own (JAX's is ml_dtypes'): such an array crosses as its bits."""
    if isinstance(value, np.ndarray):
        array = value if value.flags.writeable else value.copy()
        if array.dtype == jnp.bfloat16:
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)
    return torch.from_dlpack(value)


def _to_host(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(jnp.bfloat16)
    return tensor.numpy()


def _conv_params(stride, padding, dilation, transposed, output_padding, groups) -> tuple:
    return (
        [int(s) for s in stride],
        [int(p) for p in padding],
        [int(d) for d in dilation],
        bool(transposed),
        [int(p) for p in output_padding],
        int(groups),
    )


def _meta(shape, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """``aten.convolution`` by torch's kernel on the host, for batched operands of one dtype
    ``applies`` accepts; the result in the dtype it was computed in (bfloat16 or float32),
    before any rounding to a half dtype."""
    params = _conv_params(stride, padding, dilation, transposed, output_padding, groups)
    computed = _COMPUTED_IN[jnp.dtype(x.dtype)]
    operands = [a.astype(computed) for a in (x, weight, bias) if a is not None]
    shape = aten.convolution(
        _meta(x.shape), _meta(weight.shape), None if bias is None else _meta(bias.shape), *params
    ).shape

    _lowering_one()
    result = jax.ShapeDtypeStruct(tuple(shape), computed)
    if _native():
        call = jax.ffi.ffi_call(_CONVOLUTION, result)
        return call(*operands, **_attributes(*params))

    def on_host(x_, weight_, *bias_):
        bias_ = _to_torch(bias_[0]) if bias_ else None
        return _to_host(aten.convolution(_to_torch(x_), _to_torch(weight_), bias_, *params))

    return jax.pure_callback(on_host, result, *operands)


def _native() -> bool:
    """Whether the current lowering calls the convolution kernels through the engine's FFI
    library (``Target.native_kernels``), which it then registers with JAX."""
    if "convolution" not in target.current().native_kernels:
        return False
    why = LIBRARY.unavailable()
    if why is not None:
        raise CstorchRuntimeError(f"torch's convolution kernels cannot be called natively: {why}")
    return True


def _attributes(stride, padding, dilation, transposed, output_padding, groups) -> dict:
    """The custom calls' attributes (``native/torch_convolutions.cc``)."""
    return dict(
        stride=np.array(stride, np.int64),
        padding=np.array(padding, np.int64),
        dilation=np.array(dilation, np.int64),
        transposed=transposed,
        output_padding=np.array(output_padding, np.int64),
        groups=np.int64(groups),
    )


def convolution_backward(
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
    """``aten.convolution_backward`` by torch's kernel on the host: ``(grad_x, grad_weight,
    grad_bias)``, None where ``output_mask`` says so, in the dtype computed in (bfloat16 or
    float32)."""
    params = _conv_params(stride, padding, dilation, transposed, output_padding, groups)
    mask = [bool(m) for m in output_mask]
    computed = _COMPUTED_IN[jnp.dtype(x.dtype)]
    bias_sizes = None if bias_sizes is None else [int(s) for s in bias_sizes]
    shapes = [
        tuple(x.shape),
        tuple(weight.shape),
        tuple(bias_sizes) if bias_sizes is not None else None,
    ]
    results = [jax.ShapeDtypeStruct(s, computed) for s, m in zip(shapes, mask) if m]
    if not results:
        return None, None, None

    _lowering_one()
    operands = [a.astype(computed) for a in (grad_output, x, weight)]
    if _native():
        call = jax.ffi.ffi_call(_CONVOLUTION_BACKWARD, tuple(results))
        computed_grads = call(
            *operands,
            bias_sizes=np.array(bias_sizes or [], np.int64),
            output_mask=np.array(mask, np.int64),
            **_attributes(*params),
        )
    else:

        def on_host(grad_output_, x_, weight_):
            grads = aten.convolution_backward(
                _to_torch(grad_output_),
                _to_torch(x_),
                _to_torch(weight_),
                bias_sizes,
                *params,
                mask,
            )
            return tuple(_to_host(g) for g, m in zip(grads, mask) if m)

        computed_grads = jax.pure_callback(on_host, tuple(results), *operands)
    computed_grads = iter(computed_grads)
    return tuple(next(computed_grads) if m else None for m in mask)


def leading_contraction_applies(a, b) -> bool:
    """Whether the current lowering calls torch's kernel for ``aᵀ·b``: two bfloat16 matrices
    contracted over their leading dims (``cpu_half_dots``). XLA's CPU library dots take only
    a row-major left operand, so XLA computes this form in float32 through Eigen (a
    2048x256 by 2048x1024 weight gradient: 5.8 ms against torch's 2.5 on 2 Zen 4 cores)."""
    return applies(a, b, kind="half_dot") and a.dtype == jnp.bfloat16 and a.ndim == b.ndim == 2


def leading_contraction(a, b):
    """``aᵀ·b`` for bfloat16 matrices ``a`` (k x m) and ``b`` (k x n) by torch's kernel on the
    host: oneDNN's bfloat16 GEMM, which accumulates in float32 and rounds the result once to
    bfloat16, as eager torch's ``mm`` of the same operands (autocast's weight gradients)."""

    def on_host(a_, b_):
        return _to_host(torch.mm(_to_torch(a_).t(), _to_torch(b_)))

    _lowering_one()
    result = jax.ShapeDtypeStruct((a.shape[1], b.shape[1]), a.dtype)
    return jax.pure_callback(on_host, result, a, b)
