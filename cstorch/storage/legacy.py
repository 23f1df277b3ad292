"""Reader for checkpoints older than format 0.5 (cerebras releases 1.7 to 2.0, formats 0.1-0.4).

Those files keep the structure as root attribute ``__spec__`` = the hex of a (dill-)pickled
``torch.utils._pytree.TreeSpec``, and one dataset per leaf named ``urllib.parse.quote(key,
safe="")`` and tagged by an ``__H5_TYPE__`` attribute:

=============================  ===============================================================
``__H5_TYPE__``                value
=============================  ===============================================================
``TorchTensorH5Type``          the dataset (bf16 if attribute ``is_bfloat16``), read lazily
``NumpyArrayH5Type``           a numpy array (a tensor in formats <= 0.3)
``ScalarH5Type``               ``dataset[...].item()``
``StringH5Type``               attribute ``string_value``
``NoneH5Type``                 None
``ObjectH5Type``               attribute ``object_value``: hex of a (dill) pickle
``DeferredH5Tensor``           dataset ``key`` of this file (``link_to_self``) or ``filepath``
``FullTensorH5Type``           attributes ``shape`` / ``fill_value`` (``DeferredFullTensor`` too)
(none, release <= 1.8)         attributes ``is_none`` / ``is_string`` / ``is_constructible`` /
                               ``is_scalar``, else a tensor
=============================  ===============================================================

The pickled spec is read with the restricted unpickler, mapping ``TreeSpec``/``LeafSpec`` to
inert stand-ins, so old files load without dill and without running code. Keys the spec names
but the file lacks load as None with a warning, as in the reference. Tensors in external raw
files (``DeferredFileTensor``) and JIT-graph tensors need the Cerebras runtime and are refused.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from urllib.parse import quote

import numpy as np
import torch

from cstorch.storage import constants as C, safe_pickle, treespec
from cstorch.storage.deferred import (
    DeferredFullTensor,
    DeferredObject,
    DeferredTorchTensor,
    cache_deferred_tensors,
)
from cstorch.storage.h5_format import (
    TRUST_HINT,
    CheckpointFormatError,
    H5Reader,
    UntrustedCheckpointError,
    linked_file_allowed,
    python_value,
)
from jax_backend.errors import (
    CstorchNotImplementedError,
    CstorchRuntimeError,
    CstorchTypeError,
    quoted,
)
from jax_backend.user_frames import warn


def load(reader: H5Reader, attributes: dict, map_location, *, unsafe_allow_pickle: bool = False):
    """Loads a format < 0.5 checkpoint opened by ``reader``."""
    path = reader.path
    if map_location is not None and not isinstance(map_location, (str, torch.device)):
        raise CstorchTypeError(
            "Unsupported `map_location` provided for loading HDF5 checkpoint. Expected `None` "
            f"or a torch device, but got `{map_location!r}`"
        )
    cache = map_location == "cache"
    device = None if map_location in (None, "cache") else torch.device(map_location)
    if device is not None and device.type == "cpu":
        device = None

    raw = attributes.get(C.__SPEC__)
    if not raw:
        raise CstorchRuntimeError(
            f"Checkpoint `{path}` is an HDF5 file but does not conform to the Cerebras HDF5 "
            "checkpoint specification (no __spec__). Please ensure that the checkpoint was "
            "saved using `cstorch.save()`."
        )
    try:
        pickled = bytes.fromhex(python_value(raw))
    except (TypeError, ValueError) as e:
        raise CheckpointFormatError(f"Checkpoint '{path}': legacy __spec__ is not hex: {e}") from e
    spec_object = safe_pickle.loads(
        pickled,
        what=f"the __spec__ of legacy checkpoint '{path}'",
        unsafe_allow_pickle=unsafe_allow_pickle,
        legacy_spec=True,
    )
    spec = _to_node(spec_object, path)
    version = float(attributes.get(C.__VERSION__, 0.1))

    keys = [".".join(p) for p in spec.paths()]
    missing = sorted({k for k in keys if quote(k, safe="") not in reader})
    if missing:
        warn(f"The checkpoint is missing the following keys that are found in the spec: {missing}")
    values = []
    with cache_deferred_tensors(cache):
        for key in keys:
            value = None
            if key not in missing:
                value = _load_value(reader, quote(key, safe=""), version, unsafe_allow_pickle)
            if device is not None and isinstance(value, torch.Tensor):
                value = value.to(device)
            values.append(value)
    return spec.unflatten(iter(values))


def _to_node(spec, path: str) -> treespec.Node:
    children = list(getattr(spec, "children_specs", None) or [])
    kind = getattr(spec, "type", None)
    if (
        getattr(spec, "is_leaf_spec", False)
        or type(spec).__name__ == "LeafSpec"
        or (kind is None and not children)
    ):
        return treespec.Node(None, None)
    nodes = [_to_node(child, path) for child in children]
    context = getattr(spec, "context", None)
    indices = [str(i) for i in range(len(nodes))]
    node = treespec.Node(getattr(kind, "__qualname__", str(kind)), None, nodes, indices)
    if kind in (dict, OrderedDict):
        keys = list(context)
        node.child_keys = [str(k) for k in keys]
        node.build = lambda values, kind=kind, keys=keys: kind(zip(keys, values))
    elif kind in (list, tuple, set):
        node.build = kind
    elif isinstance(context, type) and issubclass(context, tuple) and hasattr(context, "_fields"):
        node.build = lambda values, cls=context: cls(*values)  # namedtuple: context is the class
    else:
        raise CheckpointFormatError(
            f"Legacy checkpoint '{path}' uses container type {quoted(kind)}, which this reader does "
            "not know how to rebuild."
        )
    return node


def _tensor(reader: H5Reader, name: str, dtype: torch.dtype | None = None) -> DeferredTorchTensor:
    dset = reader.dataset(name)
    if dtype is None:
        dtype = torch.bfloat16 if dset.attrs.get("is_bfloat16") else _torch_dtype(dset.dtype, name)
    metadata = {C.__TYPE__: C.TORCH_TENSOR, "shapes": [list(dset.shape)], "dtypes": [str(dtype)]}
    return DeferredTorchTensor(DeferredObject(reader, name, metadata), dset.shape, dtype)


def _torch_dtype(np_dtype, name: str) -> torch.dtype:
    for dtype, stored in C.TORCH_TO_NUMPY.items():
        if stored == np_dtype and dtype is not torch.bfloat16:
            return dtype
    raise CheckpointFormatError(f"legacy dataset {quoted(name)} has unsupported dtype {np_dtype}")


def _full(reader: H5Reader, name: str) -> DeferredFullTensor:
    dset = reader.dataset(name)
    dtype = torch.bfloat16 if dset.attrs.get("is_bfloat16") else _torch_dtype(dset.dtype, name)
    fill = dset.attrs.get("fill_value")
    return DeferredFullTensor(
        torch.Size(python_value(dset.attrs["shape"])),
        dtype,
        None if fill is None else python_value(fill),
    )


def _load_value(reader: H5Reader, name: str, version: float, unsafe_allow_pickle: bool):
    dset = reader.dataset(name)
    attrs = dset.attrs
    kind = python_value(attrs.get(C.LEGACY_H5_TYPE)) if C.LEGACY_H5_TYPE in attrs else None
    if kind == "TorchTensorH5Type" or (kind == "NumpyArrayH5Type" and version <= 0.3):
        return _tensor(reader, name)
    if kind == "NumpyArrayH5Type":
        array = reader.read_array(name)
        return array.view(C.BF16_NUMPY) if attrs.get("is_bfloat16") else array
    if kind == "ScalarH5Type":
        return dset[...].item()
    if kind == "StringH5Type":
        return python_value(attrs["string_value"])
    if kind == "NoneH5Type":
        return None
    if kind == "ObjectH5Type":
        return safe_pickle.loads(
            bytes.fromhex(python_value(attrs["object_value"])),
            what=f"key {quoted(name)} of legacy checkpoint '{reader.path}'",
            unsafe_allow_pickle=unsafe_allow_pickle,
        )
    if kind in ("DeferredH5Tensor", "StoredTensorH5Type"):
        key = python_value(attrs["key"])
        if attrs.get("link_to_self", False):
            return _tensor(reader, key)
        target = python_value(attrs["filepath"])
        if not linked_file_allowed(reader.path, target, unsafe_allow_pickle):
            raise UntrustedCheckpointError(
                f"Key {quoted(name)} of legacy checkpoint '{reader.path}' reads its data from a file "
                f"outside its directory ('{target}'). {TRUST_HINT}"
            )
        target = os.path.join(os.path.dirname(reader.path), target)  # as linked_file_allowed
        return _tensor(H5Reader(target, trusted=unsafe_allow_pickle), key)
    if kind in ("FullTensorH5Type", "DeferredFullTensor"):
        return _full(reader, name)
    if kind is not None:
        raise CstorchNotImplementedError(
            f"Key {quoted(name)} of legacy checkpoint '{reader.path}' has type {quoted(kind)}, which needs "
            "the Cerebras runtime or external files; load and re-save it with cerebras-pytorch."
        )
    # Releases <= 1.8 wrote no __H5_TYPE__.
    if attrs.get("filepath") is not None:
        raise CstorchNotImplementedError(
            f"Key {quoted(name)} of legacy checkpoint '{reader.path}' lives in an external file "
            f"({quoted(python_value(attrs['filepath']))}); this reader does not follow it."
        )
    if attrs.get("is_constructible", False):
        return _full(reader, name)
    if attrs.get("is_none", False):
        return None
    if attrs.get("is_string", False):
        return python_value(attrs.get("string_val"))
    if attrs.get("is_scalar", False):
        return np.asarray(reader.read_array(name)).item()
    return _tensor(reader, name)
