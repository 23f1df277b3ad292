"""Whether a torch tensor's memory can be reached by something that bypasses it.

Eager torch users may hold a state tensor's memory through other objects: a view
(``p[0]``, ``p.t()``), ``p.data`` or ``p.detach()``, the values of a kept ``state_dict()``,
a numpy array (``p.detach().numpy()``), or the numpy array a tensor was made from
(``torch.from_numpy``). Reads and writes through those never pass through the tensor, so
``DeviceState`` must keep such a tensor's torch memory current (see ``jax_backend.state``).

Two facts tell, at no more cost than a counter read:

* **Shared storage.** Every other tensor on the same storage (views, ``.data``, detached
  aliases, state-dict values, and the tensor a numpy export keeps as its base) holds a
  reference to the storage, so its use count is above one.
* **Memory owned by numpy.** ``torch.from_numpy`` makes a storage that refers to the array's
  memory and cannot be resized; the array can be held by the user with no storage reference
  at all. A non-resizable storage is *foreign* unless the engine knows where it came from:
  it made the tensor itself (``note_own_memory``: ``jax_backend.dtypes`` makes tensors from
  private numpy copies) or saw its storage resizable before (``note_resizable``). Storage
  becomes non-resizable for good once anything exports it to numpy, so what was seen earlier
  is remembered, per tensor and storage.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

_use_count = getattr(torch._C, "_storage_Use_Count", None)

# tensor -> address of the storage it had when its memory was known to be torch's own
_own_memory = WeakIdKeyDictionary()


def _storage_address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def shared_elsewhere(tensor: torch.Tensor) -> bool:
    """Whether anything besides ``tensor`` holds its storage. Callers run it under
    ``DisableTorchFunctionSubclass`` for guarded tensors (looking must not fill them)."""
    if _use_count is None:  # torch too old to tell: assume the worst
        return True
    storage = tensor.untyped_storage()
    return _use_count(storage._cdata) > 2  # the tensor and `storage` above


def note_own_memory(tensor: torch.Tensor) -> torch.Tensor:
    """Records that ``tensor``'s memory belongs to torch or the engine (nothing outside can
    write it); returns the tensor."""
    _own_memory[tensor] = _storage_address(tensor)
    return tensor


def note_resizable(tensors) -> None:
    """Remembers, for each tensor whose storage can be resized (so no numpy array owns its
    memory), that its memory is torch's own, until its storage is replaced."""
    for tensor in tensors:
        if (
            isinstance(tensor, torch.Tensor)
            and tensor.device.type == "cpu"
            and tensor.layout == torch.strided
            and tensor.untyped_storage().resizable()
        ):
            _own_memory[tensor] = _storage_address(tensor)


def may_be_foreign(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory may belong to a numpy array that someone else holds
    (``torch.from_numpy``): its storage cannot be resized and the engine does not know it as
    its own (module docstring)."""
    if tensor.device.type != "cpu" or tensor.layout != torch.strided:
        return False
    storage = tensor.untyped_storage()
    if storage.resizable():
        return False
    return _own_memory.get(tensor) != storage._cdata
