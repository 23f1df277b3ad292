"""``cstorch.save``: write a state dict as a cerebras-pytorch H5 checkpoint (format 0.5).

Steps, as in the reference:

1. flatten the state dict; leaves get dotted keys (:mod:`cstorch.storage.treespec`);
2. a leaf seen before (same ``id()``, which also catches interned ints and strings, ``None``,
   ``True``...) becomes a ``LinkedObject`` to its first key, so tied weights are stored once;
3. write the root attributes ``__spec__``, ``__version__``, ``__cstorch_version__``;
4. write every leaf (:mod:`cstorch.storage.serializers`);
5. write one ``<key>.__metadata__`` attribute per leaf and finally ``__SUCCESS__ = True``.

Everything goes to a temporary file in the same directory that appears at ``ckpt_path`` only once
complete and synced to disk, replacing an existing file there in one atomic rename, as
``torch.save`` overwrites (:class:`cstorch.storage.h5_format.H5Writer`); a full disk or a
file-size limit ends in one ``OSError`` naming the path and the space needed.

cerebras-pytorch 2.10 refuses to overwrite (``FileExistsError``); ``exist_ok=False`` keeps that
behaviour. Overwriting by default is a deliberate difference: scripts that save to a fixed path
(``torch.save`` habits, the Cerebras docs' examples) must run twice in a row.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from cstorch.distributed import runtime
from cstorch.storage import constants as C, conversions, serializers, treespec
from cstorch.storage.h5_format import COMPACT_ATTRIBUTE_LIMIT, H5Writer
from jax_backend.errors import CstorchValueError


def save(state_dict, ckpt_path: str | os.PathLike, *, exist_ok: bool = True) -> None:
    """Saves ``state_dict`` to ``ckpt_path`` in the cerebras-pytorch H5 checkpoint format.

    **Arguments:**

    - ``state_dict``: a (nested) dict/list/tuple of tensors, numpy arrays, scalars, strings,
      None and picklable objects. ``jax_backend`` lazy tensors and ``jax.Array`` leaves are
      written straight from their host buffers.
    - ``ckpt_path``: where to write. An existing file there is replaced atomically: readers and
      a crash see either the old checkpoint or the new one, never half a file; of concurrent
      saves to one path, the last to finish wins, and every version is complete.
    - ``exist_ok``: ``False`` refuses to replace an existing file (cerebras-pytorch 2.10's
      behaviour), even against a concurrent writer.

    **Raises:**

    - ``FileExistsError`` if ``exist_ok=False`` and ``ckpt_path`` exists.
    - ``ValueError`` for tensors the format cannot hold (int8, complex, float8, sparse) and for
      state-dict keys that collide once joined with dots.
    - ``TypeError`` for leaves that cannot be pickled.

    On any error the partial file is removed and ``ckpt_path`` is left as it was.

    In a multi-process job only process 0 writes (one checkpoint per job); values split
    across processes were gathered when the state dict was taken.
    """
    path = os.fspath(ckpt_path)
    if runtime.process_index() != 0:
        return
    flat = treespec.flatten(state_dict)
    for key in flat.keys:
        if not key:
            raise CstorchValueError(
                "cstorch.save expects a container (e.g. a dict) at the top of the state dict: "
                f"a bare {type(flat.leaves[0]).__name__} or an empty-string key has no name in "
                "the checkpoint. Wrap it, e.g. cstorch.save({'value': x}, path)."
            )

    entries = _link_duplicates(flat.keys, flat.leaves)
    # Non-tensor leaves are encoded up front: their size decides the HDF5 attribute layout.
    encoded = {
        key: serializers.encode(value, key) for key, value in entries if not _is_array_like(value)
    }
    dense = any(
        e.payload is not None and len(e.payload) > COMPACT_ATTRIBUTE_LIMIT for e in encoded.values()
    )

    writer = H5Writer(path, dense_attributes=dense, overwrite=exist_ok)
    try:
        writer.write_root_attributes(
            {
                C.__SPEC__: json.dumps(
                    [treespec.human_readable(state_dict, flat.spec), flat.spec.dumps()], indent=4
                ),
                C.__VERSION__: np.float64(C.CURRENT_CKPT_FORMAT_VERSION),
                C.__CSTORCH_VERSION__: C.CSTORCH_VERSION,
            }
        )
        metadata = {}
        for key, value in entries:
            entry = encoded.pop(key, None) or serializers.encode(value, key)
            if entry.array is not None:
                writer.write_array(key, entry.array, entry.metadata)
            elif entry.payload is not None:
                writer.write_bytes(key, entry.payload, entry.metadata)
            metadata[f"{key}.{C.__METADATA__}"] = _leaf_metadata_json(key, entry.metadata)
            del entry  # drop the host copy of a JAX array before converting the next one
        metadata[C.__SUCCESS__] = np.bool_(True)
        writer.write_root_attributes(metadata)
        writer.commit()
    except BaseException as error:
        writer.abort()
        if isinstance(error, OSError) and error.filename == path:
            raise error.with_traceback(None) from None  # the clear disk-space error
        raise
    _saved(path)


def _saved(path: str) -> None:
    """Tells the backend a checkpoint was written (it may keep only the newest few: the
    2.0/2.1 ``max_checkpoints``)."""
    from cstorch.backend import current_backend_impl

    impl = current_backend_impl(raise_exception=False)
    keeper = getattr(impl, "checkpoint_keeper", None)
    if keeper is not None:
        keeper.saved_checkpoint(path)


def _link_duplicates(keys: list[str], leaves: list) -> list[tuple[str, object]]:
    first_key: dict[int, str] = {}
    entries = []
    for key, leaf in zip(keys, leaves):
        first = first_key.setdefault(id(leaf), key)
        entries.append((key, leaf if first == key else serializers.LinkedObject(first)))
    return entries


def _is_array_like(value) -> bool:
    if isinstance(value, np.ndarray):
        return conversions.numpy_dtype_is_storable(value.dtype)
    return isinstance(value, torch.Tensor) or conversions.is_jax_array(value)


def _leaf_metadata_json(key: str, metadata: dict) -> str:
    return json.dumps(
        {
            C.__SPEC__: [{key: "*"}, treespec.leaf_spec_string(key)],
            C.__OBJECTS__: [key],
            f"{key}.{C.__METADATA__}": metadata,
        },
        indent=4,
    )
