"""torch's own CPU kernels, called from a compiled CPU step on the host (``jax.pure_callback``).

XLA's CPU convolutions are far slower than torch's (oneDNN) on common shapes: on
pytorch/examples' MNIST network the weight gradient of the 32->64 convolution, which JAX
lowers as a convolution with a 24x24 window, takes XLA about six times the CPU time of
torch's ``convolution_backward`` (``benchmarks/cpu_results.md``). So a step the engine compiles for
the CPU and runs in its own process calls torch's kernels for every convolution and
convolution gradient instead: the same kernels eager torch runs, hence eager torch's numbers
(bit for bit in float32) at eager torch's speed.

Where: only in the engine's own program for one CPU device (``Target.torch_kernels``, which
``Program`` sets from the setting ``cpu_convolutions``, read when the program is built). A
GPU, a mesh of devices, an export (``jax.export`` cannot serialize a host callback, and the
artifact runs without torch), ``pure_function`` (a JAX function the user may transform) and
the lowerings called directly keep the XLA lowering (``ops.nn``).

What it costs: JAX never writes a program with a host callback to its persistent compilation
cache (the callback belongs to the process), so such a step compiles again in every process;
its XLA compile is shorter, without the convolutions. Each operand reaches torch without a
copy (DLPack); each result is copied once into XLA's buffer.

Dtypes: float32 operands go to torch as they are. Half operands (autocast's bfloat16 and
float16) are widened to float32 (exactly) and the result is rounded once, as the XLA lowering
does on a CPU (``ops._common.dot_result_dtype``); float64, complex and integer convolutions
keep the XLA lowering.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp
import numpy as np
import torch

from jax_backend import config, target

aten = torch.ops.aten

# Operand dtypes torch's kernels serve here, and the dtype they are computed in.
_COMPUTED_IN = {
    jnp.dtype(jnp.float32): jnp.float32,
    jnp.dtype(jnp.bfloat16): jnp.float32,
    jnp.dtype(jnp.float16): jnp.float32,
}


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


def wanted(platform: str, layout) -> bool:
    """Whether a program for ``platform`` (on one device when ``layout`` is None) calls torch's
    kernels: the setting ``cpu_convolutions``, on a CPU with one device."""
    return platform == "cpu" and layout is None and config.cpu_convolutions.value == "torch"


def applies(*arrays) -> bool:
    """Whether the current lowering calls torch's kernels for an op on ``arrays`` (None: an
    absent operand)."""
    if not target.current().torch_kernels:
        return False
    dtypes = {jnp.dtype(a.dtype) for a in arrays if a is not None}
    return len(dtypes) == 1 and dtypes <= _COMPUTED_IN.keys()


def _to_torch(value) -> torch.Tensor:
    """A callback operand as a torch tensor, without a copy where JAX hands over an array
    (DLPack); a read-only numpy array (older JAX) is copied, as torch cannot wrap one."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value if value.flags.writeable else value.copy())
    return torch.from_dlpack(value)


def _to_host(tensor: torch.Tensor) -> np.ndarray:
    return tensor.contiguous().numpy()


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
    ``applies`` accepts; the result in the dtype it was computed in (float32), before any
    rounding to a half dtype."""
    params = _conv_params(stride, padding, dilation, transposed, output_padding, groups)
    computed = _COMPUTED_IN[jnp.dtype(x.dtype)]
    operands = [a.astype(computed) for a in (x, weight, bias) if a is not None]
    shape = aten.convolution(
        _meta(x.shape), _meta(weight.shape), None if bias is None else _meta(bias.shape), *params
    ).shape

    def on_host(x_, weight_, *bias_):
        bias_ = _to_torch(bias_[0]) if bias_ else None
        return _to_host(aten.convolution(_to_torch(x_), _to_torch(weight_), bias_, *params))

    _lowering_one()
    return jax.pure_callback(on_host, jax.ShapeDtypeStruct(tuple(shape), computed), *operands)


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
    grad_bias)``, None where ``output_mask`` says so, in the dtype computed in (float32)."""
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

    def on_host(grad_output_, x_, weight_):
        grads = aten.convolution_backward(
            _to_torch(grad_output_), _to_torch(x_), _to_torch(weight_), bias_sizes, *params, mask
        )
        return tuple(_to_host(g) for g, m in zip(grads, mask) if m)

    _lowering_one()
    computed_grads = iter(
        jax.pure_callback(
            on_host, tuple(results), *(a.astype(computed) for a in (grad_output, x, weight))
        )
    )
    return tuple(next(computed_grads) if m else None for m in mask)
