"""Leaf serializers: how each kind of state-dict leaf is stored, and how it is read back.

Every leaf gets a metadata dict whose ``__TYPE__`` names the reference serializer class and
which says where the value lives: ``__NONE__`` (in the metadata itself), ``__NUMPY__`` (an array
dataset) or ``__BYTES__`` (a pickle in an empty dataset's attribute).

==========================  ===========================  ========================================
leaf                        ``__TYPE__``                 stored as
==========================  ===========================  ========================================
torch.Tensor / LazyTensor   ``TorchTensorSerializer``    dataset; ``__TORCH__``, ``shapes``,
/ jax.Array                                              ``dtypes``, ``rtfx_dtypes``; bf16 as int16
bool / int / float          ``ScalarSerializer``         ``scalar_value``
str                         ``StringSerializer``         ``string_value``
None                        ``NoneSerializer``           nothing
numpy.ndarray (numeric)     ``NumpyArraySerializer``     dataset; ``is_bfloat16``
anything else               ``ObjectSerializer``         pickle (dill if importable)
second name of a leaf       ``LinkedObject``             ``key`` of the first name
==========================  ===========================  ========================================

Reading also understands what only the wafer (CSX) writes: ``NestedObject`` wrappers around
``DeferredFullTensor``, ``DeferredTorchTensor`` and ``DeferredObject`` external links, and raw
``__RTFX__`` bytes. ``DeferredGraphTensor`` needs the Cerebras runtime and is refused clearly.

This module also re-exports the public deferred-tensor classes and context flags of
``cerebras.pytorch.storage.serializers``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from cstorch.storage import constants as C, conversions, safe_pickle
from cstorch.storage.deferred import (  # public re-exports
    BooleanContext,
    DeferredFileTensor,
    DeferredFullTensor,
    DeferredGraphTensor,
    DeferredObject,
    DeferredSafeTensor,
    DeferredTensor,
    DeferredTorchTensor,
    cache_deferred_tensors,
    check_deferred_backing_storage,
    materialize_deferred_tensors,
    saving_initial_state,
    use_cstorch_types,
    use_external_link,
)
from cstorch.storage.treespec import NestedObject
from jax_backend.errors import CstorchNotImplementedError, CstorchTypeError, quoted

__all__ = [
    "BooleanContext",
    "DeferredFileTensor",
    "DeferredFullTensor",
    "DeferredGraphTensor",
    "DeferredObject",
    "DeferredSafeTensor",
    "DeferredTensor",
    "DeferredTorchTensor",
    "LinkedObject",
    "cache_deferred_tensors",
    "check_deferred_backing_storage",
    "materialize_deferred_tensors",
    "saving_initial_state",
    "use_cstorch_types",
    "use_external_link",
]


@dataclass(frozen=True)
class LinkedObject:
    """A second name for a leaf stored under ``key`` (tied weights, shared objects)."""

    key: str


# --------------------------------------------------------------------------------------------
# Saving


@dataclass
class Encoded:
    """A serialized leaf: its metadata and at most one of an array or a pickle payload."""

    metadata: dict
    array: np.ndarray | None = None
    payload: bytes | None = None


def encode(value: Any, key: str) -> Encoded:
    """Serializes one leaf the way the reference does (metadata keys in the reference's order)."""
    if isinstance(value, LinkedObject):
        return Encoded(
            {"key": value.key, C.LINKED_FLAG: True, C.__TYPE__: C.LINKED, C.NONE_FLAG: True}
        )
    if isinstance(value, torch.Tensor):
        if isinstance(value, DeferredTensor):
            # Re-saving a loaded checkpoint: read the value without keeping it in memory.
            value = value._materialize(cache_override=value.is_materialized)
        array, dtype = conversions.tensor_to_array(value, key)
        return _tensor_entry(array, dtype)
    if conversions.is_jax_array(value):
        array, dtype = conversions.jax_to_array(value, key)
        return _tensor_entry(array, dtype)
    if isinstance(value, (bool, int, float)):
        return Encoded({"scalar_value": value, C.__TYPE__: C.SCALAR, C.NONE_FLAG: True})
    if isinstance(value, str):
        return Encoded({"string_value": value, C.__TYPE__: C.STRING, C.NONE_FLAG: True})
    if value is None:
        return Encoded({C.__TYPE__: C.NONE, C.NONE_FLAG: True})
    if isinstance(value, np.ndarray) and conversions.numpy_dtype_is_storable(value.dtype):
        is_bf16 = C.is_bf16_numpy(value.dtype)
        array = value.view(np.int16) if is_bf16 else value
        return Encoded(
            {
                "is_bfloat16": is_bf16,
                C.__TYPE__: C.NUMPY_ARRAY,
                C.NUMPY_FLAG: True,
                "compressed": False,
            },
            array=array,
        )
    try:
        payload = safe_pickle.dumps(value)
    except Exception as e:  # pickling can raise anything a __reduce__ raises
        raise CstorchTypeError(
            f"Cannot save {key!r}: a {type(value).__qualname__} is neither a tensor, "
            f"array, scalar or string, and pickling it failed: {e}"
        ) from e
    return Encoded({C.__TYPE__: C.OBJECT, C.BYTES_FLAG: True, "compressed": False}, payload=payload)


def _tensor_entry(array: np.ndarray, dtype: torch.dtype) -> Encoded:
    return Encoded(
        {
            C.TORCH_FLAG: True,
            "shapes": [list(array.shape)],
            "dtypes": [str(dtype)],
            "rtfx_dtypes": [C.RTFX_CODES[dtype]],
            C.__TYPE__: C.TORCH_TENSOR,
            C.NUMPY_FLAG: True,
            "compressed": False,
        },
        array=array,
    )


# --------------------------------------------------------------------------------------------
# Loading


@dataclass
class LoadOptions:
    """What a load may do: unpickle freely, and open the files that external links name."""

    path: str
    unsafe_allow_pickle: bool = False
    open_reader: Callable[[str], Any] | None = None  # path -> reader, for DeferredObject links


@dataclass
class Stored:
    """A sub-key of a leaf whose value sits in the file (listed in ``__objects__``)."""

    key: str
    metadata: dict


def deserialize(value: Any, reader, options: LoadOptions) -> Any:
    """Turns an unflattened per-leaf structure (see ``load``) into the leaf's value."""
    if isinstance(value, Stored):
        return _decode_stored(value.key, value.metadata, reader, options)
    if isinstance(value, NestedObject):
        inner = deserialize(value.object, reader, options)
        return _decode_nested(inner, value.metadata, options)
    if isinstance(value, dict):
        return type(value)((k, deserialize(v, reader, options)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(deserialize(v, reader, options) for v in value)
    raise _corrupt(options, f"unexpected metadata entry {quoted(value)}")


def _decode_stored(key: str, metadata: dict, reader, options: LoadOptions) -> Any:
    kind = metadata.get(C.__TYPE__)
    if kind is None:
        raise _corrupt(
            options, f"metadata of key {quoted(key)} has no __TYPE__: {quoted(metadata)}"
        )
    if metadata.get(C.NONE_FLAG):
        value = _decode_inline(kind, key, metadata, options)
    else:  # __NUMPY__ or __BYTES__: the value is in the dataset named ``key``
        value = _decode_dataset(kind, key, metadata, reader, options)
    if metadata.get(C.TORCH_FLAG) and not isinstance(value, torch.Tensor):
        value = _as_tensor(value, metadata, options)
    return value


def _decode_inline(kind: str, key: str, metadata: dict, options: LoadOptions) -> Any:
    if kind == C.SCALAR:
        return metadata["scalar_value"]
    if kind == C.STRING:
        return metadata["string_value"]
    if kind == C.NONE:
        return None
    if kind == C.LINKED:
        return LinkedObject(metadata["key"])
    if kind == "DeferredFullTensor":
        dtype = C.torch_dtype_from_name(metadata["dtype"])
        return DeferredFullTensor(torch.Size(metadata["shape"]), dtype, metadata.get("fill_value"))
    if kind == "DeferredObject" or metadata.get("deferred_object_cls"):
        return _external_link(key, metadata, options)
    if kind in ("DeferredSafeTensor", "DeferredFileTensor"):
        raise CstorchNotImplementedError(
            f"Key {quoted(key)} of checkpoint '{options.path}' refers to a tensor in another file "
            f"({kind}, {quoted(metadata.get('path') or metadata.get('filepath'))}); this reader "
            "does not "
            "follow such references. Load that file directly instead."
        )
    raise _unknown(kind, key, options)


def _decode_dataset(kind: str, key: str, metadata: dict, reader, options: LoadOptions) -> Any:
    stored = DeferredObject(reader, key, metadata)
    if metadata.get(C.TORCH_FLAG):
        return stored  # wrapped into a DeferredTorchTensor by the caller
    if kind == C.NUMPY_ARRAY:
        array = stored.read_array()
        if stored.merged_metadata().get("is_bfloat16"):
            array = array.view(C.BF16_NUMPY)
        return array
    if kind == C.OBJECT:
        return safe_pickle.loads(
            stored.read_bytes(),
            what=f"key {quoted(key)} of checkpoint '{options.path}'",
            unsafe_allow_pickle=options.unsafe_allow_pickle,
        )
    if kind in (C.TORCH_TENSOR, "DeferredTorchTensor"):
        return stored
    raise _unknown(kind, key, options)


def _decode_nested(inner: Any, metadata: dict, options: LoadOptions) -> Any:
    kind = metadata.get(C.__TYPE__)
    if kind in (C.TORCH_TENSOR, "DeferredTorchTensor"):
        return inner if isinstance(inner, torch.Tensor) else _as_tensor(inner, metadata, options)
    if kind == "DeferredGraphTensor":
        raise CstorchNotImplementedError(
            f"Checkpoint '{options.path}' holds a DeferredGraphTensor (a tensor defined by a "
            "Cerebras JIT graph, written on CSX with external links). Computing it needs the "
            "Cerebras runtime; re-save the checkpoint with the reference and "
            "cstorch.storage.serializers.use_external_link(False)."
        )
    raise _unknown(kind, "<nested>", options)


def _as_tensor(value: Any, metadata: dict, options: LoadOptions) -> torch.Tensor:
    shape = metadata["shapes"][0] if "shapes" in metadata else metadata["shape"]
    if "dtypes" in metadata:
        dtype = C.torch_dtype_from_name(metadata["dtypes"][0])
    elif "rtfx_dtypes" in metadata:
        dtype = C.RTFX_TO_TORCH[int(metadata["rtfx_dtypes"][0])]
    else:
        dtype = C.torch_dtype_from_name(metadata["dtype"])
    if isinstance(value, DeferredObject):
        return DeferredTorchTensor(value, shape, dtype)
    if isinstance(value, np.ndarray):
        return conversions.array_to_tensor(value, dtype)
    raise _corrupt(options, f"tensor metadata {metadata} without tensor data")


def _external_link(key: str, metadata: dict, options: LoadOptions) -> DeferredObject:
    path = metadata.get("path")
    if options.open_reader is None or not path:
        raise _corrupt(options, f"external link at {quoted(key)} without a target")
    target = path if os.path.isabs(path) else os.path.join(os.path.dirname(options.path), path)
    return DeferredObject(
        options.open_reader(target), metadata["key"], metadata.get("metadata") or {}
    )


def _unknown(kind: str, key: str, options: LoadOptions) -> Exception:
    return NotImplementedError(
        f"Key {quoted(key)} of checkpoint '{options.path}' was written by an unknown serializer "
        f"{quoted(kind)}; this reader knows {C.TORCH_TENSOR}, {C.SCALAR}, {C.STRING}, {C.NONE}, "
        f"{C.NUMPY_ARRAY}, {C.OBJECT}, {C.LINKED} and the CSX deferred-tensor entries."
    )


def _corrupt(options: LoadOptions, what: str) -> Exception:
    return RuntimeError(f"Checkpoint '{options.path}' is corrupt: {what}")
