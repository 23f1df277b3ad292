"""``cstorch.load``: read a checkpoint lazily, without running code from the file.

Dispatch:

* a file object -> ``torch.load(f, weights_only=True)``;
* an HDF5 file -> format 0.5 (below) or, if ``__version__ < 0.5``, :mod:`cstorch.storage.legacy`;
* any other file -> safetensors (the ``safetensors`` package if installed, else our own reader,
  only for files that parse as safetensors), then ``torch.load(path, weights_only=True)``.

Format 0.5: the root ``__spec__`` gives the structure and the top-level keys; each key's
``<key>.__metadata__`` JSON holds a per-leaf spec (usually ``{key: leaf}``, a ``NestedObject``
for CSX-only entries), the sub-keys that have data (``__objects__``) and their metadata. Tensors
become :class:`~cstorch.storage.deferred.DeferredTorchTensor` (read on first use); numpy arrays
and pickled objects are read at load time (objects through the restricted unpickler);
``LinkedObject`` entries become the very object of the key they name.

Files are untrusted unless the caller passes ``unsafe_allow_pickle=True``. Without it, pickles
are refused (beyond plain data), ``torch.load`` runs with ``weights_only=True``, defaultdict
factories other than builtins and ``collections`` types are refused, and so is anything that
would read another file (HDF5 external links, external raw storage, virtual datasets,
``DeferredObject`` links and legacy ``filepath`` entries) or allocate far more memory than
the file stores (:class:`~cstorch.storage.h5_format.UntrustedCheckpointError`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from cstorch.storage import constants as C, legacy, safetensors_format, serializers, treespec
from cstorch.storage.deferred import cache_deferred_tensors
from cstorch.storage.h5_format import (
    TRUST_HINT,
    CheckpointFormatError,
    H5Reader,
    UntrustedCheckpointError,
    linked_file_allowed,
)
from cstorch.storage.serializers import LinkedObject, LoadOptions, Stored
from jax_backend.atomic_files import is_temp_name
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError, quoted
from jax_backend.regular_files import check_regular


def load(ckpt_path, map_location=None, *, unsafe_allow_pickle: bool = False, **kwargs) -> Any:
    """Loads a checkpoint written by ``cstorch.save`` (or a torch / safetensors checkpoint).

    **Arguments:**

    - ``ckpt_path``: a path, or a file object (read with ``torch.load``).
    - ``map_location``: ``None`` or ``"cpu"`` keeps tensors deferred (read from the file when
      first used, never cached); ``"cache"`` keeps them deferred but caches each value once
      read; another device (str or ``torch.device``) moves every tensor there (reading it now);
      a dict maps ``"cpu"`` to a device, as in ``torch.load``.
    - ``unsafe_allow_pickle``: allow unpickling arbitrary Python objects stored in the file.
      Only for files you trust: unpickling can execute code. Without it, only plain data
      (builtins, torch dtypes/devices/Size, numpy arrays/dtypes/scalars, collections) is
      unpickled, torch checkpoints are read with ``weights_only=True``, and other values raise
      :class:`~cstorch.storage.safe_pickle.UnsafePickleError`.
    - ``**kwargs``: passed to ``torch.load`` for torch checkpoints (ignored for H5 files).

    **Returns:** the state dict, with its containers, dict keys (including ints), tuples, None,
    scalars and strings as saved, and tied tensors restored as one object.

    **Raises:** ``FileNotFoundError`` if the path does not exist; ``IsADirectoryError`` for
    a directory and ``jax_backend.regular_files.NotARegularFileError`` (an ``OSError``) for a
    FIFO, socket or device, before anything is read from it; ``RuntimeError`` for a
    partially written, truncated or corrupt checkpoint, or a file no reader accepts.
    """
    if not isinstance(ckpt_path, (str, os.PathLike)):
        return _torch_load(ckpt_path, map_location, unsafe_allow_pickle, **kwargs)

    path = os.fspath(ckpt_path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No checkpoint at '{path}': the file does not exist.")
    if os.path.isdir(path):
        raise IsADirectoryError(f"Cannot load checkpoint '{path}': it is a directory, not a file.")
    # A FIFO, socket or device: refused before any reader opens it (it could block forever).
    check_regular(path, "checkpoint")
    if is_temp_name(path) and not _is_complete_h5(path):
        raise CstorchRuntimeError(
            f"Cannot load '{path}': it is the temporary file of a cstorch.save that did not "
            "finish (the process was stopped while saving), so it is incomplete. Load the "
            "checkpoint it was meant to become, or an earlier one; the next save to that "
            "path removes this leftover."
        )
    if not H5Reader.is_hdf5(path):
        return _load_non_h5(path, map_location, unsafe_allow_pickle, **kwargs)

    reader = H5Reader(path, trusted=unsafe_allow_pickle)
    attributes = reader.root_attributes()
    version = float(attributes.get(C.__VERSION__, 0.1))
    if version < C.CURRENT_CKPT_FORMAT_VERSION:
        return legacy.load(
            reader, attributes, map_location, unsafe_allow_pickle=unsafe_allow_pickle
        )
    if not attributes.get(C.__SUCCESS__, False):
        raise CstorchRuntimeError(
            f"Cannot load partially written checkpoint at '{path}'. The save that wrote it did "
            "not finish (its __SUCCESS__ flag is missing), so some values may be missing; "
            "use an earlier checkpoint or save again."
        )
    return _load_v05(reader, attributes, map_location, unsafe_allow_pickle)


def _is_complete_h5(path: str) -> bool:
    try:
        return H5Reader.is_hdf5(path) and bool(H5Reader(path).root_attributes().get(C.__SUCCESS__))
    except (OSError, RuntimeError):
        return False


def _load_v05(reader: H5Reader, attributes: dict, map_location, unsafe_allow_pickle: bool):
    path = reader.path
    spec = treespec.loads(
        _spec_string(attributes.get(C.__SPEC__), path, "the root"),
        allow_imports=unsafe_allow_pickle,
    )
    keys = [".".join(p) for p in spec.paths()]
    cache = isinstance(map_location, str) and map_location == "cache"
    device = None if cache else _target_device(map_location)
    readers: dict[str, H5Reader] = {os.path.realpath(path): reader}

    def open_reader(target: str) -> H5Reader:
        real = os.path.realpath(target)
        if real not in readers:
            if not linked_file_allowed(path, target, unsafe_allow_pickle):
                raise UntrustedCheckpointError(
                    f"Checkpoint '{path}' links to data in a file outside its directory "
                    f"('{target}'); following it could read any file on this machine. "
                    f"{TRUST_HINT}"
                )
            readers[real] = H5Reader(real, trusted=unsafe_allow_pickle)
        return readers[real]

    options = LoadOptions(path, unsafe_allow_pickle, open_reader)
    values = []
    with cache_deferred_tensors(cache):
        for key in keys:
            value = serializers.deserialize(
                _leaf_structure(attributes, key, path, unsafe_allow_pickle), reader, options
            )
            if device is not None and isinstance(value, torch.Tensor):
                value = value.to(device)
            values.append(value)

    first: dict[str, Any] = {}
    for key, value in zip(keys, values):
        first.setdefault(key, value)
    resolved = [_resolve_link(value, first, path) for value in values]
    return spec.unflatten(iter(resolved))


def _leaf_structure(attributes: dict, key: str, path: str, unsafe_allow_pickle: bool):
    """The per-key metadata, unflattened into Stored entries / metadata dicts / NestedObjects."""
    raw = attributes.get(f"{key}.{C.__METADATA__}")
    if raw is None:
        raise CheckpointFormatError(
            f"Checkpoint '{path}' has no metadata for key {quoted(key)}: corrupt file."
        )
    try:
        metadata = json.loads(raw)
        leaf_spec = _spec_string(metadata[C.__SPEC__], path, repr(key))
        objects = set(metadata[C.__OBJECTS__])
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointFormatError(
            f"Checkpoint '{path}' has malformed metadata for key {quoted(key)}: {str(e)[:200]}"
        ) from e

    def entry(sub_key: str):
        try:
            sub_metadata = metadata[f"{sub_key}.{C.__METADATA__}"]
        except KeyError:
            raise CheckpointFormatError(
                f"Checkpoint '{path}' lacks the metadata of {quoted(sub_key)}: corrupt file."
            ) from None
        return Stored(sub_key, sub_metadata) if sub_key in objects else sub_metadata

    if leaf_spec == treespec.leaf_spec_string(key):  # the common case: no parsing needed
        return entry(key)
    inner = treespec.loads(leaf_spec, allow_imports=unsafe_allow_pickle)
    structure = inner.unflatten(iter([entry(".".join(p)) for p in inner.paths()]))
    try:
        return structure[key]
    except (KeyError, TypeError):
        raise CheckpointFormatError(
            f"Checkpoint '{path}': the metadata of {quoted(key)} describes another key."
        ) from None


def _spec_string(spec_entry, path: str, where: str) -> str:
    try:
        value = json.loads(spec_entry) if isinstance(spec_entry, (str, bytes)) else spec_entry
        return value[1]
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise CheckpointFormatError(
            f"Checkpoint '{path}' has no readable __spec__ for {where}: {str(e)[:200]}"
        ) from e


def _resolve_link(value, first: dict, path: str):
    seen = set()
    while isinstance(value, LinkedObject):
        if value.key in seen or value.key not in first:
            raise CheckpointFormatError(
                f"Checkpoint '{path}' links to key {quoted(value.key)}, which it does not contain."
            )
        seen.add(value.key)
        value = first[value.key]
    return value


def _target_device(map_location):
    """The device every tensor should move to, or None to keep them deferred on CPU."""
    if map_location is None:
        return None
    if isinstance(map_location, dict):
        map_location = map_location.get("cpu")
        if map_location is None:
            return None
    if isinstance(map_location, (str, torch.device)):
        device = torch.device(map_location)
        return None if device.type == "cpu" and device.index is None else device
    raise CstorchTypeError(
        f"Unsupported map_location {map_location!r} for an H5 checkpoint: use None, 'cpu', "
        "'cache', a device string, a torch.device, or a dict mapping 'cpu' to one."
    )


def _load_non_h5(path: str, map_location, unsafe_allow_pickle: bool, **kwargs):
    if safetensors_format.looks_like_safetensors(path):
        return _load_safetensors(path, map_location)
    return _torch_load(path, map_location, unsafe_allow_pickle, **kwargs)


def _load_safetensors(path: str, map_location):
    device = None if map_location == "cache" else _target_device(map_location)
    try:
        import safetensors.torch as st
    except ImportError:
        state_dict = safetensors_format.read(path)
    else:
        state_dict = st.load_file(path)
    if device is not None:
        state_dict = {k: v.to(device) for k, v in state_dict.items()}
    return state_dict


def _torch_load(source, map_location, unsafe_allow_pickle: bool, **kwargs):
    if isinstance(map_location, str) and map_location == "cache":
        map_location = None
    kwargs.setdefault("weights_only", not unsafe_allow_pickle)
    try:
        return torch.load(source, map_location=map_location, **kwargs)
    except FileNotFoundError:
        raise
    except Exception as e:  # torch.load raises many kinds of errors for foreign files
        hint = (
            ""
            if not kwargs["weights_only"]
            else " It was read with weights_only=True; if it is a torch checkpoint from a source "
            "you trust, pass unsafe_allow_pickle=True."
        )
        name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else repr(source)
        raise CstorchRuntimeError(
            f"Failed to load checkpoint file '{name}': it is not a cerebras H5 checkpoint or a "
            f"safetensors file, and torch.load failed with {type(e).__name__}: {e}.{hint}"
        ) from e
