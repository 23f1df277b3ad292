"""Device-resident state: the JAX arrays that hold torch state tensors between steps.

After a compiled step the newest value of a parameter, buffer or optimizer-state tensor lives
in a JAX array; the torch tensor keeps its last synchronised value until someone asks for it.
Eager torch semantics still hold for the torch objects:

* Each state tensor is *guarded* (its class becomes ``GuardedParameter`` / ``GuardedTensor``,
  same identity): the first torch operation that reads or edits it copies the newest value in
  first, so ``print(p)``, ``p.add_(x)`` or ``p.clamp_(-c, c)`` between steps see the newest value.
* An edit on the torch side is noticed before the next step and uploaded: by the tensor's
  version counter (in-place ops, ``load_state_dict``), by its storage (``p.data = t``), and
  by ``p.data`` having been handed out (its edits bump no counter).
* A value that cannot be read back (its step failed) is dropped, with an error, instead of
  poisoning every later read.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import weakref
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from jax_backend.dtypes import array_to_tensor, tensor_to_array, tensor_to_host
from jax_backend.errors import StepFailedError

_no_guard = torch._C.DisableTorchFunctionSubclass

# Tensor attributes and methods that read no values: they never force a synchronisation.
_METADATA = frozenset({
    "shape", "dtype", "device", "size", "dim", "stride", "requires_grad", "is_leaf", "grad",
    "grad_fn", "_version", "numel", "ndim", "layout", "is_cuda", "is_cpu", "is_sparse",
    "is_meta", "is_quantized", "is_nested", "is_mkldnn", "element_size", "nelement", "_is_view",
    "_base", "is_floating_point", "is_complex", "storage_offset", "is_contiguous", "names",
    "nbytes", "itemsize", "requires_grad_", "retain_grad", "register_hook",
    "register_post_accumulate_grad_hook", "_backward_hooks", "__len__", "data_ptr",
    "_post_accumulate_grad_hooks", "retains_grad", "_cdata", "__dir__",
})
_DATA = torch._C.TensorBase.__dict__["data"]


def _name(func) -> str:
    name = getattr(func, "__name__", "")
    owner = getattr(func, "__self__", None)
    if name in ("__get__", "__set__", "__delete__") and owner is not None:
        return getattr(owner, "__name__", "")
    return name


def _guard_torch_function(cls, func, types, args=(), kwargs=None):
    kwargs = kwargs or {}
    name = _name(func)
    if name not in _METADATA:
        for value in tree_flatten((args, kwargs))[0]:
            if isinstance(value, _GUARDED):
                owner = value.__dict__.get("_cstorch_device_state")
                state = owner() if owner is not None else None
                if state is not None:
                    state._before_torch_access(value, func)
    with _no_guard():
        return func(*args, **kwargs)


@contextlib.contextmanager
def _as_plain(tensor):
    """The tensor with its newest value and plain class, e.g. to copy or pickle it."""
    owner = tensor.__dict__.get("_cstorch_device_state")
    state = owner() if owner is not None else None
    if state is not None:
        state._before_torch_access(tensor, None)
    guard = type(tensor)
    tensor.__class__ = _BASE_OF[guard]
    tensor.__dict__.pop("_cstorch_device_state", None)
    try:
        yield tensor
    finally:
        tensor.__class__ = guard
        if owner is not None:
            tensor.__dict__["_cstorch_device_state"] = owner


class _Guard:
    """What both guarded classes add to their base (see the module docstring)."""

    __torch_function__ = classmethod(_guard_torch_function)

    def __deepcopy__(self, memo):
        with _as_plain(self):
            return copy.deepcopy(self, memo)

    def __reduce_ex__(self, protocol):
        with _as_plain(self):
            return self.__reduce_ex__(protocol)

    def __repr__(self, *args, **kwargs):
        with _as_plain(self):
            return self.__repr__(*args, **kwargs)


class GuardedParameter(_Guard, torch.nn.Parameter):
    """A parameter whose newest value may live on the JAX side (see module docstring)."""


class GuardedTensor(_Guard, torch.Tensor):
    """A state tensor whose newest value may live on the JAX side (see module docstring)."""


_GUARDED = (GuardedParameter, GuardedTensor)
_GUARD_OF = {torch.nn.Parameter: GuardedParameter, torch.Tensor: GuardedTensor}
_BASE_OF = {GuardedParameter: torch.nn.Parameter, GuardedTensor: torch.Tensor}


def _storage_key(tensor: torch.Tensor):
    """Where the tensor's data lives: changes when ``p.data = t`` rebinds it."""
    return tensor.data_ptr(), tensor.shape


@dataclasses.dataclass
class _Entry:
    tensor: torch.Tensor
    array: jax.Array
    synced_version: int
    storage: tuple = None  # _storage_key at the last synchronisation
    array_is_newer: bool = False
    data_handed_out: bool = False  # p.data was read: it may have been edited uncounted

    def torch_side_changed(self) -> bool:
        return (self.data_handed_out or self.tensor._version != self.synced_version
                or _storage_key(self.tensor) != self.storage)


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

    def _place(self, host):
        if self.layout is not None:
            return self.layout.place_state(host)
        return jax.device_put(host, self.device)

    def _upload(self, tensor: torch.Tensor) -> _Entry:
        if self.layout is not None:
            array = self.layout.place_state(tensor_to_host(tensor))
        else:
            array = tensor_to_array(tensor, self.device)
        entry = _Entry(tensor, array, tensor._version, _storage_key(tensor))
        self._entries[id(tensor)] = entry
        return entry

    def arrays(self, tensors: Sequence[torch.Tensor]) -> list:
        """The current arrays of ``tensors``, uploading any the torch side has changed."""
        result = []
        with _no_guard():
            for tensor in tensors:
                entry = self._entries.get(id(tensor))
                if entry is None or entry.tensor is not tensor or entry.torch_side_changed():
                    entry = self._upload(tensor)
                result.append(entry.array)
        return result

    def update(self, tensors: Sequence[torch.Tensor], arrays: Sequence) -> None:
        """Records new values computed on the JAX side; the torch tensors are now stale."""
        with _no_guard():
            for tensor, array in zip(tensors, arrays):
                entry = self._entries.get(id(tensor))
                if entry is None or entry.tensor is not tensor:
                    entry = _Entry(tensor, array, tensor._version, _storage_key(tensor))
                    self._entries[id(tensor)] = entry
                entry.array = array
                entry.array_is_newer = True
                self._guard(tensor)
        self._pending = self._pending or bool(tensors)

    # ------------------------------------------------------------------ guards
    def _guard(self, tensor: torch.Tensor) -> None:
        if type(tensor) in _BASE_OF and tensor.__dict__.get("_cstorch_device_state") is not None:
            return  # already guarded (release() unguards everything a state guarded)
        guard = _GUARD_OF.get(type(tensor))
        if guard is not None:
            tensor.__dict__["_cstorch_device_state"] = weakref.ref(self)
            tensor.__class__ = guard
        elif isinstance(tensor, _GUARDED):
            tensor.__dict__["_cstorch_device_state"] = weakref.ref(self)

    @staticmethod
    def _unguard(tensor: torch.Tensor) -> None:
        base = _BASE_OF.get(type(tensor))
        if base is not None:
            tensor.__class__ = base
            tensor.__dict__.pop("_cstorch_device_state", None)

    def _before_torch_access(self, tensor: torch.Tensor, func) -> None:
        """A torch operation is about to use ``tensor``: give it the newest value first."""
        entry = self._entries.get(id(tensor))
        if entry is None or entry.tensor is not tensor:
            return
        if entry.array_is_newer:
            self.materialize([tensor])
        if getattr(func, "__self__", None) is _DATA:
            entry.data_handed_out = True

    def release(self) -> None:
        """Gives every tensor its plain class back (the backend is going away)."""
        for entry in self._entries.values():
            self._unguard(entry.tensor)

    # ------------------------------------------------------------------ failures
    def host_copies(self, tensors: Sequence[torch.Tensor]) -> list | None:
        """Host copies of the tensors' current arrays: a backup against a failing step. None
        when some array is split across processes (each holds only its part)."""
        arrays = self.arrays(tensors)
        if not all(getattr(a, "is_fully_addressable", True) for a in arrays):
            return None
        return [np.array(a, copy=True) for a in arrays]

    def recover(self, tensors: Sequence[torch.Tensor], arrays: Sequence, backup=None) -> str:
        """After a failed step: puts back the state a step consumed (donated) before failing.

        Arrays still alive are kept. Deleted ones come back from ``backup`` (host copies) if
        there is one, else the entry is dropped so the torch value (the last synchronised
        one) is used again. Returns a sentence saying which happened."""
        lost = [i for i, a in enumerate(arrays) if a.is_deleted()]
        with _no_guard():
            for i in lost:
                tensor = tensors[i]
                entry = self._entries.get(id(tensor))
                if backup is not None:
                    if entry is not None:
                        entry.array = self._place(backup[i])
                elif entry is not None:
                    self._unguard(tensor)
                    del self._entries[id(tensor)]
        if backup is not None:
            return "The state of the last good step was restored."
        return (f"{len(lost)} state tensors consumed by the step were rolled back to their last "
                "synchronised values (the last state_dict()/checkpoint).")

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
        """Copies newer JAX values into their torch tensors (in place, keeping identities).

        A value that cannot be read (the step that made it failed) is dropped, so the torch
        tensor keeps its last synchronised value, and ``StepFailedError`` says so."""
        if not self._pending:
            return
        if tensors is None:
            entries = list(self._entries.values())
        else:
            entries = [e for e in (self._entries.get(id(t)) for t in tensors) if e is not None]
        failed = []
        with torch.no_grad(), _no_guard():
            for entry in entries:
                if entry.array_is_newer:
                    try:
                        value = array_to_tensor(entry.array)
                    except Exception as error:  # noqa: BLE001 - reported below
                        failed.append((entry, error))
                        continue
                    entry.tensor.copy_(value)
                    entry.synced_version = entry.tensor._version
                    entry.storage = _storage_key(entry.tensor)
                    entry.array_is_newer = False
            for entry, _ in failed:
                self._unguard(entry.tensor)
                self._entries.pop(id(entry.tensor), None)
        if tensors is None:
            self._pending = False
        else:
            self._pending = any(e.array_is_newer for e in self._entries.values())
        if failed:
            raise StepFailedError(
                f"{len(failed)} state tensors hold the result of a step that failed "
                f"({type(failed[0][1]).__name__}: {failed[0][1]}). They were rolled back to "
                "their last synchronised values; the state is readable and training can go "
                "on from there.") from failed[0][1]

    def forget(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            entry = self._entries.pop(id(tensor), None)
            if entry is not None:
                self._unguard(entry.tensor)

    def retain(self, tensors: Iterable[torch.Tensor]) -> None:
        """Drops entries of tensors that are no longer state (e.g. replaced optimizer state)."""
        keep = {id(t) for t in tensors}
        for key in [k for k in self._entries if k not in keep]:
            self._unguard(self._entries.pop(key).tensor)
