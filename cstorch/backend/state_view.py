"""``StateView``: where the backend's state lives at one moment.

Every tensor that outlives a step sits in a slot (``jax_backend.Slot``: a container and a key)
that a registered object exposes, under a path such as ``("model", 0, "fc", "param",
"weight")`` (``Registry.state_slots``). A view lists those slots and the unique tensors they
hold, each named by the path of its first slot (tied weights share one), with the model
parameters and the optimizers' links to them that a compiled program depends on.
"""

from __future__ import annotations

import torch

from cstorch.storage.deferred import DeferredTensor


class StateView:
    """A snapshot of where the state lives: slots with their paths, and the unique tensors
    they hold (each named by the path of its first slot)."""

    def __init__(self, epoch: int, entries: list):
        self.epoch = epoch
        self.slots = [slot for _, slot in entries]
        self.held = [slot.get() for slot in self.slots]
        seen, tensors, paths = set(), [], []
        for (path, _), tensor in zip(entries, self.held):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                tensors.append(tensor)
                paths.append(path)
        self.tensors = tensors
        self.paths = paths
        self.index_of = {path: i for i, path in enumerate(paths)}
        # model parameters (unique), whose requires_grad and hooks select a program
        self.parameters = [
            t for path, t in zip(paths, tensors) if path[0] == "model" and path[3] == "param"
        ]
        # every slot's path -> the path naming its tensor (tied weights share one)
        first = dict(zip(map(id, tensors), paths))
        self.named_by = {path: first[id(tensor)] for (path, _), tensor in zip(entries, self.held)}
        self.optimizer_params: tuple = ()  # set by the registry (optimizer_links)
        self.group_sizes: tuple = ()  # set by the registry (param_group_sizes)

    def path_of(self, tensor):
        """The path naming ``tensor`` (its first slot), or None if it is not state here."""
        for path, held in zip(self.paths, self.tensors):
            if held is tensor:
                return path
        return None

    def aval(self, index: int) -> tuple:
        tensor = self.tensors[index]
        return tuple(tensor.shape), tensor.dtype

    def still_holds(self) -> bool:
        return all(
            slot.container.get(slot.key) is tensor for slot, tensor in zip(self.slots, self.held)
        )


def read_deferred_state(entries) -> None:
    """Reads each deferred tensor (``cstorch.load``'s, read from the file on use) that became
    state into a tensor of its own, in its slot. torch's ``load_state_dict`` keeps the loaded
    tensors themselves, and ``clone()`` of an unmodified deferred tensor is deferred too; the
    state guard cannot watch one, so every step would write its state through to it. The
    reference's CSX backend likewise moves loaded state to its device."""
    for _, slot in entries:
        value = slot.get()
        if isinstance(value, DeferredTensor):  # copy_ reads it (torch dispatch)
            slot.set(torch.empty(value.shape, dtype=value.dtype).copy_(value))
