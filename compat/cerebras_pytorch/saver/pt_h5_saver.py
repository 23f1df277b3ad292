"""``PyTorchH5Saver`` under its 1.7-2.1 name: cstorch's (the 2.0-2.2 interface: ``save``,
``load``, ``is_valid_checkpoint``, ``extract_version``, ``flatten_state_dict``, ...) plus what
the 1.x Model Zoo's appliance runner also calls.

The 1.x appliance runner writes a checkpoint in pieces: ``flatten_state_dict(state)`` gives
``{dotted key: leaf}`` and a spec, ``save_spec(path, spec)`` announces what the file will
hold, then ``save_tensor(path, key, value)`` (or the appliance's ``save_weights``) fills in
each leaf. Files here are cstorch checkpoints (``cstorch.save``/``cstorch.load`` read and
write them, so ``cbtorch.load`` and 2.x code read a 1.x run's checkpoints): the pieces are
kept until the last leaf of the spec arrives, and the file is then written whole, at once
(never half a checkpoint on disk). ``load_tensor``/``tensor_names`` read finished files.

``PyTorchH5Saver(loaded_checkpoint=path).save(file, state)`` writes ``state`` with every leaf
that ``path`` also holds taken from ``path``: how the 1.x runner turns the checkpoint it
resumes from into the initial state of the run. With ``is_pretrained_checkpoint=True``
(1.8/1.9: fine-tuning from pretrained weights) only the model's leaves (``model.*``) are
taken from it; the optimizer and step start fresh.
"""

from __future__ import annotations

import os
from typing import Any

import torch

import cstorch
from cstorch.saver.pt_h5_saver import PyTorchH5Saver as _PyTorchH5Saver2x

_SEP = "."
_SPECS: dict = {}  # id(2.x spec) -> (that spec, the structure _unflatten rebuilds)


def _flatten(tree, prefix=""):
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            if not isinstance(key, (str, int)):
                raise TypeError(
                    f"Checkpoint keys must be str or int, got {key!r} "
                    f"({type(key).__name__}) under {prefix or 'the root'!r}."
                )
            out.update(_flatten(value, f"{prefix}{key}{_SEP}"))
        return out
    if isinstance(tree, (list, tuple)):
        out = {}
        for index, value in enumerate(tree):
            out.update(_flatten(value, f"{prefix}{index}{_SEP}"))
        return out
    return {prefix[:-1]: tree}


def _spec(tree):
    """The structure of ``tree`` with its leaves left out (what ``_unflatten`` rebuilds; an
    empty container holds no leaf, as in cstorch's ``flatten_state_dict``)."""
    if isinstance(tree, dict):
        return ("dict", [(k, _spec(v)) for k, v in tree.items()])
    if isinstance(tree, (list, tuple)):
        return (type(tree).__name__, [_spec(v) for v in tree])
    return ("leaf",)


def _unflatten(spec, values: dict, prefix=""):
    kind = spec[0]
    if kind == "leaf":
        return values[prefix[:-1]]
    if kind == "dict":
        return {k: _unflatten(s, values, f"{prefix}{k}{_SEP}") for k, s in spec[1]}
    items = [_unflatten(s, values, f"{prefix}{i}{_SEP}") for i, s in enumerate(spec[1])]
    return tuple(items) if kind == "tuple" else items


def _leaf_keys(spec, prefix=""):
    kind = spec[0]
    if kind == "leaf":
        return [prefix[:-1]]
    if kind == "dict":
        return [k for key, s in spec[1] for k in _leaf_keys(s, f"{prefix}{key}{_SEP}")]
    return [k for i, s in enumerate(spec[1]) for k in _leaf_keys(s, f"{prefix}{i}{_SEP}")]


def _host(value):
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


class PyTorchH5Saver(_PyTorchH5Saver2x):
    _pending: dict = {}  # path -> (spec, {key: value}) of a checkpoint being written

    def __init__(
        self, loaded_checkpoint: str | None = None, is_pretrained_checkpoint: bool = False
    ):
        self.loaded_checkpoint = loaded_checkpoint
        self.is_pretrained_checkpoint = bool(is_pretrained_checkpoint)

    # ------------------------------------------------------------------------ whole files
    def save(self, path: str, state_dict: dict) -> None:
        flat = {k: _host(v) for k, v in _flatten(state_dict).items()}
        if self.loaded_checkpoint:
            if not self.is_valid_checkpoint(self.loaded_checkpoint):
                raise ValueError(
                    f"loaded_checkpoint {self.loaded_checkpoint!r} is not a complete H5 checkpoint."
                )
            loaded = _flatten(cstorch.load(self.loaded_checkpoint))
            flat.update(
                {
                    k: loaded[k]
                    for k in flat
                    if k in loaded
                    and (not self.is_pretrained_checkpoint or k.startswith("model" + _SEP))
                }
            )
        cstorch.save(_unflatten(_spec(state_dict), flat), path)

    def flatten_state_dict(self, state_dict: dict):
        """cstorch's ``(flat, spec)``; the spec is also remembered with the structure the
        piecewise write rebuilds the checkpoint from (``save_spec``)."""
        flat, spec = super().flatten_state_dict(state_dict)
        _SPECS[id(spec)] = (spec, _spec(state_dict))
        return flat, spec

    # -------------------------------------------------------------------- piece by piece
    def save_spec(self, path: str, spec) -> None:
        if id(spec) not in _SPECS or _SPECS[id(spec)][0] is not spec:
            raise ValueError("save_spec takes the spec that flatten_state_dict returned.")
        PyTorchH5Saver._pending[os.path.abspath(path)] = (_SPECS[id(spec)][1], {})

    def save_tensor(self, path: str, key: str, value: Any) -> None:
        where = os.path.abspath(path)
        if where not in PyTorchH5Saver._pending:
            raise NotImplementedError(
                f"save_tensor({path!r}, {key!r}): tensors cannot be added to an existing "
                "checkpoint (the format is written whole and published atomically). For a new "
                "file, call save_spec with flatten_state_dict's spec first; otherwise build "
                "the state dict and call cstorch.save."
            )
        spec, values = PyTorchH5Saver._pending[where]
        keys = _leaf_keys(spec)
        if key not in keys:
            raise KeyError(f"{key!r} is not in the spec saved for {path!r}.")
        values[key] = _host(value)
        if len(values) == len(keys):  # complete: write the whole file at once
            del PyTorchH5Saver._pending[where]
            cstorch.save(_unflatten(spec, values), path)

    # --------------------------------------------------------------------------- reading
    @staticmethod
    def tensor_names(path: str) -> list:
        return list(_flatten(cstorch.load(path)))


class CerebrasStateDict(dict):
    """The state dict of a checkpoint written piece by piece (1.x handed it to the runner's
    post-transfer callback); the values are read from the finished file."""

    @classmethod
    def create(cls, spec, path: str) -> "CerebrasStateDict":
        if PyTorchH5Saver.is_valid_checkpoint(path):
            return cls(cstorch.load(path))
        return cls()
