"""The one place where torch and JAX dtypes meet.

* ``TORCH_TO_JAX`` / ``JAX_TO_TORCH``: the dtype tables.
* ``tensor_to_array`` / ``array_to_tensor``: copying conversions between torch tensors and
  JAX arrays (bfloat16 travels as its int16 bit pattern, since numpy has no bfloat16).
* ``result_type``: torch's type-promotion rules, applied to JAX arrays and Python scalars.

The engine's work runs with JAX's 64-bit types (``jax_settings.engine_scope``, never the
user's process-wide setting) so that int64 indices and float64 tensors keep torch's dtypes
instead of being narrowed silently.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

from jax_backend.errors import CstorchError, CstorchTypeError
from jax_backend.jax_settings import in_engine_scope
from jax_backend.mesh import host_value
from jax_backend.shared_memory import note_own_memory

TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int8: jnp.int8,
    torch.int16: jnp.int16,
    torch.int32: jnp.int32,
    torch.int64: jnp.int64,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
}
JAX_TO_TORCH = {np.dtype(v): k for k, v in TORCH_TO_JAX.items()}
# The numpy dtypes, converted once here: ``np.dtype(jnp.float32)`` calls a Python property
# of JAX's scalar types (``__numpy_dtype__``), and numpy loses or garbles an exception raised
# inside it, so a Ctrl-C landing there came out as a SystemError, or not at all. A step's
# uploads convert every input's and state tensor's dtype, so the lookups stay in C.
_NUMPY_DTYPES = {k: np.dtype(v) for k, v in TORCH_TO_JAX.items()}
_BY_SCALAR_TYPE = {v: k for k, v in TORCH_TO_JAX.items()}


class UnsupportedDtypeError(CstorchError, TypeError):
    """A torch dtype that has no JAX counterpart was used in a step."""


def to_jax_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return _NUMPY_DTYPES[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"torch dtype {dtype} has no JAX equivalent; supported dtypes are "
            f"{', '.join(str(d) for d in TORCH_TO_JAX)}."
        ) from None


def to_torch_dtype(dtype) -> torch.dtype:
    try:
        if isinstance(dtype, np.dtype):
            return JAX_TO_TORCH[dtype]
        if dtype in _BY_SCALAR_TYPE:  # jnp.float32 and the like (see _NUMPY_DTYPES)
            return _BY_SCALAR_TYPE[dtype]
        return JAX_TO_TORCH[np.dtype(dtype)]
    except KeyError:
        raise UnsupportedDtypeError(f"JAX dtype {dtype} has no torch equivalent.") from None


def tensor_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy copy-or-view of a CPU tensor's values, bfloat16 included."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def tensor_to_host(tensor: torch.Tensor) -> np.ndarray:
    """A private numpy copy of a tensor (a step's input batch), ready to be passed to a
    jitted function. For tensors that may be state, see ``state_to_host``.

    jit transfers numpy arguments itself, which is much cheaper than ``device_put``; the copy
    makes that safe under asynchronous dispatch (later changes to the tensor cannot race)."""
    to_jax_dtype(tensor.dtype)  # raises a clear error for unsupported dtypes
    return np.array(tensor_to_numpy(tensor), copy=True)


def state_to_host(tensor: torch.Tensor) -> np.ndarray:
    """``tensor_to_host`` for a tensor that may be state, without exporting it to numpy.

    ``tensor.numpy()`` marks a storage non-resizable for good, and a non-resizable storage
    is how a tensor made from a user's numpy array is told apart (``shared_memory``); a
    DLPack export leaves the storage as it was, at the cost of one copy as before (a few
    microseconds more on tiny tensors)."""
    to_jax_dtype(tensor.dtype)
    source = tensor.detach()
    if source.device.type != "cpu":
        source = source.cpu()
    source = source.resolve_conj().resolve_neg()
    bits = source.view(torch.int16) if source.dtype == torch.bfloat16 else source
    try:
        host = np.array(np.from_dlpack(bits), copy=True)
    except (BufferError, TypeError, RuntimeError):  # a layout DLPack cannot describe
        return tensor_to_numpy(source.clone())  # a private clone: exporting it is fine
    return host.view(ml_dtypes.bfloat16) if source.dtype == torch.bfloat16 else host


@in_engine_scope
def tensor_to_array(tensor: torch.Tensor, device=None) -> jax.Array:
    """Copies a torch tensor, which may be state, into a new JAX array (never aliases torch
    memory, never exports the tensor to numpy: see ``state_to_host``)."""
    return jax.device_put(state_to_host(tensor), device)


def array_to_numpy(array) -> np.ndarray:
    """The global value of ``array`` (gathered when it spans processes: see ``mesh``)."""
    return host_value(array)


def _numpy_view(host: np.ndarray) -> torch.Tensor:
    """A torch tensor on ``host``'s memory (bfloat16 through its int16 bits). Not a view in
    torch's sense: its storage has no other tensor holding it (``shared_memory``)."""
    if host.dtype == ml_dtypes.bfloat16:
        bits = torch.from_numpy(host.view(np.int16))
        tensor = torch.empty(0, dtype=torch.bfloat16)
        tensor.set_(bits.untyped_storage(), 0, bits.shape, bits.stride())
        return tensor
    return torch.from_numpy(host)


def _numpy_to_tensor(host: np.ndarray) -> torch.Tensor:
    """The torch tensor sharing ``host``, a private array nobody else holds: its memory is
    the engine's own (``shared_memory.note_own_memory``)."""
    return note_own_memory(_numpy_view(host))


def array_to_tensor(array) -> torch.Tensor:
    """Copies a JAX array into a new, writable CPU torch tensor."""
    return _numpy_to_tensor(np.array(array_to_numpy(array), copy=True))


def copy_into(tensor: torch.Tensor, host: np.ndarray) -> None:
    """Writes ``host`` (``array_to_numpy`` of a value of the tensor's shape and dtype) into a
    CPU tensor in place, with one copy and without exporting the tensor to numpy (see
    ``state_to_host``); bumps no version counter."""
    target = tensor.detach()
    if target.dtype == torch.bfloat16:
        target, host = target.view(torch.int16), host.view(np.int16)
    try:
        destination = np.from_dlpack(target)
        np.copyto(destination, host.reshape(destination.shape), casting="no")
    except (BufferError, TypeError, RuntimeError, ValueError):  # a layout DLPack cannot describe
        with torch.no_grad():
            tensor.copy_(_numpy_view(np.array(host, copy=True)))


def initial_tensor(array) -> torch.Tensor:
    """``array_to_tensor`` for a freshly initialised value: an all-zero one (most optimizer
    state) becomes a tensor whose memory is committed only when written (numpy's zeros are
    untouched pages that read as 0; torch.zeros writes every page)."""
    host = array_to_numpy(array)
    if host.size and not host.any():
        return _numpy_to_tensor(np.zeros(host.shape, host.dtype))
    return array_to_tensor(array)


# --------------------------------------------------------------------------------------------
# torch type promotion (c10's ResultTypeState), for JAX arrays and Python scalars.
# Tensors with dimensions outrank 0-dim tensors, which outrank Python scalars, as long as the
# lower-ranked operand is not of a higher category (bool < integer < floating < complex).


def _promote(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return torch.promote_types(a, b)


def _combine_categories(higher, lower):
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.is_complex:
        return higher
    if lower.is_complex:
        if higher.is_floating_point:
            return {torch.float64: torch.complex128}.get(higher, torch.complex64)
        return lower
    if higher.is_floating_point:
        return higher
    if higher == torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


@functools.lru_cache(maxsize=4096)
def _result_type(kinds: tuple) -> torch.dtype:
    dim_result = zero_result = wrapped_result = None
    for kind, dtype in kinds:
        if kind == "dim":
            dim_result = _promote(dim_result, dtype)
        elif kind == "zero":
            zero_result = _promote(zero_result, dtype)
        else:
            wrapped_result = _promote(wrapped_result, dtype)
    result = _combine_categories(dim_result, _combine_categories(zero_result, wrapped_result))
    if result is None:
        raise CstorchTypeError("result_type needs at least one operand")
    return result


def _operand_kind(x):
    if isinstance(x, bool):
        return ("wrapped", torch.bool)
    if isinstance(x, int):
        return ("wrapped", torch.int64)
    if isinstance(x, float):
        return ("wrapped", torch.get_default_dtype())
    if isinstance(x, complex):
        return ("wrapped", torch.complex64)
    if getattr(getattr(x, "aval", None), "weak_type", False) and np.ndim(x) == 0:
        # A step's runtime scalar (jax_backend.scalars): a Python number, traced weakly typed
        return _operand_kind({"b": False, "i": 0, "u": 0, "f": 0.0, "c": 0j}[x.dtype.kind])
    dtype = to_torch_dtype(x.dtype)
    return ("dim" if np.ndim(x) > 0 else "zero", dtype)


def result_type(*operands) -> torch.dtype:
    """torch.result_type generalised to any number of JAX arrays and Python scalars."""
    return _result_type(tuple(_operand_kind(x) for x in operands if x is not None))


def promote(a, b) -> np.dtype:
    """torch's promotion of two JAX dtypes (what JAX's default promotion gives for the pairs
    ops meet, but also allowed under ``jax_numpy_dtype_promotion="strict"``)."""
    return to_jax_dtype(torch.promote_types(to_torch_dtype(a), to_torch_dtype(b)))


def result_jax_dtype(*operands) -> np.dtype:
    return to_jax_dtype(result_type(*operands))


def float_dtype_for(dtype) -> np.dtype:
    """The dtype torch computes int-to-float ops in: integers and bool become float32."""
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
        return dtype
    return to_jax_dtype(torch.get_default_dtype())
