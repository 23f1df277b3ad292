"""Device-resident state: the JAX arrays that hold torch state tensors between steps.

After a compiled step the newest value of a parameter, buffer or optimizer-state tensor lives
in a JAX array; the torch tensor keeps its last synchronised value until someone asks for it
(``materialize``). Each entry remembers the torch tensor's version counter at the last sync,
so an in-place change made on the torch side (``load_state_dict``, a manual ``copy_``) is
noticed and uploaded before the next step.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import torch

from jax_backend.dtypes import array_to_tensor, tensor_to_array, tensor_to_host


@dataclasses.dataclass
class _Entry:
    tensor: torch.Tensor
    array: jax.Array
    synced_version: int
    array_is_newer: bool = False


class DeviceState:
    """Maps torch state tensors (by identity) to their JAX arrays."""

    def __init__(self, device=None, layout=None):
        self.device = device
        self.layout = layout  # a mesh.Layout: where state arrays are placed (None: one device)
        self._entries: dict[int, _Entry] = {}
        self._pending = False  # some array is newer than its tensor

    def __len__(self):
        return len(self._entries)

    def __contains__(self, tensor):
        return id(tensor) in self._entries

    def _upload(self, tensor: torch.Tensor) -> _Entry:
        if self.layout is not None:
            array = self.layout.place_state(tensor_to_host(tensor))
        else:
            array = tensor_to_array(tensor, self.device)
        entry = _Entry(tensor, array, tensor._version)
        self._entries[id(tensor)] = entry
        return entry

    def arrays(self, tensors: Sequence[torch.Tensor]) -> list:
        """The current arrays of ``tensors``, uploading any the torch side has changed."""
        result = []
        for tensor in tensors:
            entry = self._entries.get(id(tensor))
            if entry is None or entry.tensor is not tensor or tensor._version != entry.synced_version:
                entry = self._upload(tensor)
            result.append(entry.array)
        return result

    def update(self, tensors: Sequence[torch.Tensor], arrays: Sequence) -> None:
        """Records new values computed on the JAX side; the torch tensors are now stale."""
        for tensor, array in zip(tensors, arrays):
            entry = self._entries.get(id(tensor))
            if entry is None or entry.tensor is not tensor:
                entry = _Entry(tensor, array, tensor._version)
                self._entries[id(tensor)] = entry
            entry.array = array
            entry.array_is_newer = True
        self._pending = self._pending or bool(tensors)

    def array_of(self, tensor: torch.Tensor):
        """The newest value of ``tensor`` as a JAX array (without touching torch)."""
        return self.arrays([tensor])[0]

    def snapshot(self, tensor: torch.Tensor):
        """A new array holding the tensor's current value, safe from the next step's donation
        (the copy is dispatched asynchronously like any other computation)."""
        return jnp.array(self.array_of(tensor), copy=True)

    def is_stale(self, tensor: torch.Tensor) -> bool:
        entry = self._entries.get(id(tensor))
        return entry is not None and entry.tensor is tensor and entry.array_is_newer

    @property
    def has_pending(self) -> bool:
        return self._pending

    def materialize(self, tensors: Iterable[torch.Tensor] | None = None) -> None:
        """Copies newer JAX values into their torch tensors (in place, keeping identities)."""
        if not self._pending:
            return
        if tensors is None:
            entries = list(self._entries.values())
        else:
            entries = [e for e in (self._entries.get(id(t)) for t in tensors) if e is not None]
        with torch.no_grad():
            for entry in entries:
                if entry.array_is_newer:
                    entry.tensor.copy_(array_to_tensor(entry.array))
                    entry.synced_version = entry.tensor._version
                    entry.array_is_newer = False
        if tensors is None:
            self._pending = False
        else:
            self._pending = any(e.array_is_newer for e in self._entries.values())

    def forget(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            self._entries.pop(id(tensor), None)

    def retain(self, tensors: Iterable[torch.Tensor]) -> None:
        """Drops entries of tensors that are no longer state (e.g. replaced optimizer state)."""
        keep = {id(t) for t in tensors}
        for key in [k for k in self._entries if k not in keep]:
            del self._entries[key]
