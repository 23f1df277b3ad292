"""``PyTorchH5Saver``: the 2.0-2.2 object interface to the H5 checkpoint format.

``save``/``load`` are ``cstorch.save``/``cstorch.load``; ``is_valid_checkpoint`` and
``extract_version`` read a file's root attributes; ``flatten_state_dict`` gives the dotted
keys a checkpoint stores a state dict under. Per-tensor writes into an existing file
(``save_tensor``, ``save_spec``: the zoo's streaming checkpoint converter) are not offered:
the format here is written whole and published atomically.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from jax_backend.errors import CstorchNotImplementedError


@dataclasses.dataclass(frozen=True)
class CheckpointVersion:
    ckpt_version: float
    cstorch_version: str


class PyTorchH5Saver:
    @staticmethod
    def is_valid_checkpoint(path) -> bool:
        """True when ``path`` is an H5 checkpoint that this format wrote completely."""
        from cstorch.storage.h5_format import H5Reader

        if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
            return False
        if not H5Reader.is_hdf5(path):
            return False
        attributes = H5Reader(path).root_attributes()
        return "__version__" in attributes and bool(attributes.get("__SUCCESS__", False))

    @classmethod
    def extract_version(cls, path) -> "CheckpointVersion | None":
        """The format and writer versions of the checkpoint at ``path`` (None when it is not
        a complete H5 checkpoint of this format): ``.ckpt_version`` (float, 0.5 for the
        files written here) and ``.cstorch_version`` (str)."""
        from cstorch.storage.h5_format import H5Reader

        if not cls.is_valid_checkpoint(path):
            return None
        attributes = H5Reader(path).root_attributes()
        writer = attributes.get("__cstorch_version__", "")
        writer = writer.decode() if isinstance(writer, bytes) else str(writer)
        return CheckpointVersion(float(attributes["__version__"]), writer)

    def save(self, checkpoint_file: str, state_dict: dict) -> None:
        from cstorch.storage import save

        save(state_dict, checkpoint_file)

    def load(self, checkpoint_file: str, map_location=None, **kwargs) -> Any:
        from cstorch.storage import load

        return load(checkpoint_file, map_location=map_location, **kwargs)

    def flatten_state_dict(self, state_dict: dict):
        """``(flat, spec)``: the leaves by the dotted key the checkpoint stores them under,
        and the structure they are rebuilt from."""
        from cstorch.storage import treespec

        flattened = treespec.flatten(state_dict)
        return dict(zip(flattened.keys, flattened.leaves)), flattened.spec

    def _whole_file_only(self, name):
        raise CstorchNotImplementedError(
            f"PyTorchH5Saver.{name}: this checkpoint format is written whole (cstorch.save) "
            "and published atomically; tensors cannot be added to an existing file. Build the "
            "state dict and call cstorch.save."
        )

    def save_tensor(self, checkpoint_file, name, tensor):
        self._whole_file_only("save_tensor")

    def save_spec(self, checkpoint_file, spec):
        self._whole_file_only("save_spec")

    def load_tensor(self, checkpoint_file: str, name: str):
        """One tensor of the checkpoint, by its dotted key."""
        flat, _ = self.flatten_state_dict(self.load(checkpoint_file))
        if name not in flat:
            raise KeyError(f"{name!r} is not in checkpoint {checkpoint_file!r}.")
        return flat[name]
