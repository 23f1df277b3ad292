"""Tensor <-> stored-array conversions, including tensors that live on the JAX side.

Saving turns a tensor into the numpy array that goes into the dataset without copying when it
can: a contiguous CPU tensor becomes ``tensor.numpy()`` (a view), a JAX array becomes
``numpy.asarray(array)`` (a view on CPU), and bfloat16 becomes a view of its int16 bits.

JAX is never imported here: a ``jax_backend.lazy.LazyTensor`` or a ``jax.Array`` can only be in
a state dict if their modules were already imported, so we look them up in ``sys.modules``.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from cstorch.storage import constants as C
from jax_backend.errors import CstorchValueError

_NUMPY_TO_TORCH = {
    np_dtype: dtype for dtype, np_dtype in C.TORCH_TO_NUMPY.items() if dtype is not torch.bfloat16
}


def unsupported_dtype_error(key: str, dtype) -> ValueError:
    names = ", ".join(str(d).replace("torch.", "") for d in C.RTFX_CODES)
    return ValueError(
        f"Cannot save tensor {key!r} of dtype {dtype}: the cerebras H5 checkpoint format has no "
        f"RtFx type for it (storable dtypes: {names}). Convert it first, e.g. "
        "tensor.to(torch.int16) for int8 or torch.view_as_real(tensor) for complex."
    )


def lazy_tensor_class():
    """``jax_backend.lazy.LazyTensor`` if that module is loaded, else None."""
    module = sys.modules.get("jax_backend.lazy")
    return getattr(module, "LazyTensor", None) if module is not None else None


def is_jax_array(value) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, getattr(jax, "Array", ()))


def jax_to_array(array, key: str) -> tuple[np.ndarray, torch.dtype]:
    """A JAX array as (stored numpy array, torch dtype) -- no torch tensor in between."""
    host = np.asarray(array)
    if host.dtype.name == "bfloat16":
        return host.view(np.int16), torch.bfloat16
    dtype = _NUMPY_TO_TORCH.get(host.dtype)
    if dtype is None:
        raise unsupported_dtype_error(key, host.dtype)
    return host, dtype


def tensor_to_array(tensor: torch.Tensor, key: str) -> tuple[np.ndarray, torch.dtype]:
    """A CPU-resident torch tensor as (stored numpy array, torch dtype)."""
    lazy_cls = lazy_tensor_class()
    if lazy_cls is not None and isinstance(tensor, lazy_cls):
        # A LazyTensor that torch already touched holds its current value (possibly updated
        # in place) in ``_value``; otherwise the JAX array is the value.
        materialized = getattr(tensor, "_value", None)
        if materialized is None:
            return jax_to_array(tensor.jax_array, key)
        tensor = materialized
    dtype = tensor.dtype
    if dtype not in C.RTFX_CODES:
        raise unsupported_dtype_error(key, dtype)
    if tensor.layout != torch.strided:
        raise CstorchValueError(
            f"Cannot save tensor {key!r} with layout {tensor.layout}; call .to_dense() on it first."
        )
    plain = tensor.detach()
    if plain.device.type != "cpu":
        plain = plain.cpu()
    if type(plain) is not torch.Tensor:
        plain = plain.as_subclass(torch.Tensor)
    plain = plain.resolve_neg()
    if dtype is torch.bfloat16:
        plain = plain.view(torch.int16)
    try:
        return numpy_view(plain), dtype
    except (RuntimeError, TypeError) as e:
        raise CstorchValueError(
            f"Cannot read the data of tensor {key!r} ({type(tensor).__name__}): {e}"
        ) from e


def numpy_view(plain: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor that leaves its storage resizable. ``Tensor.numpy()`` marks
    the storage not resizable for good, which is how the engine recognises memory a numpy array
    may own (``jax_backend.shared_memory``): saving a model before compiling it would make every
    later step write its state through to torch. A DLPack view does not mark it."""
    try:
        return np.from_dlpack(plain)
    except (BufferError, RuntimeError, TypeError, ValueError):  # a dtype numpy's DLPack lacks
        return plain.numpy()


def array_to_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A stored array as a torch tensor of ``dtype`` (bf16 from int16 bits) in torch's own,
    resizable memory (one copy). ``torch.from_numpy`` memory cannot be resized, which is how
    the engine recognises memory a numpy array may own (``jax_backend.shared_memory``): state
    loaded into it would be written through to torch after every step."""
    tensor = torch.tensor(array.astype(C.TORCH_TO_NUMPY[dtype], copy=False))  # read-only ok
    return tensor.view(torch.bfloat16) if dtype is torch.bfloat16 else tensor


def rtfx_bytes_to_array(data: bytes, shape, rtfx_code: int) -> np.ndarray:
    """Raw RtFx bytes (``__RTFX__`` entries written on the wafer) as a numpy array."""
    dtype = C.RTFX_TO_TORCH.get(int(rtfx_code))
    if dtype is None:
        raise CstorchValueError(f"unknown RtFx dtype code {rtfx_code}")
    if dtype is torch.bool:
        return np.frombuffer(data, dtype=np.int16).reshape(shape or []).astype(bool)  # I1 is 16-bit
    return np.frombuffer(data, dtype=C.TORCH_TO_NUMPY[dtype]).reshape(shape or [])


def numpy_dtype_is_storable(dtype: np.dtype) -> bool:
    """Whether an array of this dtype can be a dataset (else it is pickled whole)."""
    return dtype.kind in "biufc" or C.is_bf16_numpy(dtype)
