"""The guard on state tensors: torch operations on them go through their owner first.

While a ``DeviceState`` (``jax_backend.state``) holds a tensor's newest value in a JAX array,
the tensor's class is a guard (``GuardedParameter`` / ``GuardedTensor``, same identity, same
``isinstance`` answers) and ``tensor.__dict__`` keeps a weak reference to its owner. Every
torch operation that involves the tensor then tells the owner:

* ``owner.before_torch_access(tensor)`` before it runs: the owner copies the newest value in,
  so the operation reads and edits the value eager torch would have;
* ``owner.memory_handed_out(tensor)`` after it, when its result reaches the tensor's memory
  (a view, ``.data``, ``.detach()``, the tensor itself, a numpy array, a storage, a DLPack
  capsule): edits through that result bump no counter of the tensor.

Operations that read metadata only (``_METADATA``) run without either. Copying, pickling and
printing see the plain class with the newest value (``as_plain``), so no guard leaks into a
checkpoint or a copy.
"""

from __future__ import annotations

import contextlib
import copy
import weakref

import torch
from torch.utils._pytree import tree_flatten

# Within this context torch operations on guarded tensors run as on plain ones (no owner
# is told): for the owner's own reads and writes.
no_guard = torch._C.DisableTorchFunctionSubclass

_OWNER = "_cstorch_device_state"  # the attribute, in tensor.__dict__, holding the owner

# Tensor attributes and methods that read no values: they never force a synchronisation.
_METADATA = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "size",
        "dim",
        "stride",
        "requires_grad",
        "is_leaf",
        "grad",
        "grad_fn",
        "_version",
        "numel",
        "ndim",
        "layout",
        "is_cuda",
        "is_cpu",
        "is_sparse",
        "is_meta",
        "is_quantized",
        "is_nested",
        "is_mkldnn",
        "element_size",
        "nelement",
        "_is_view",
        "_base",
        "is_floating_point",
        "is_complex",
        "storage_offset",
        "is_contiguous",
        "names",
        "nbytes",
        "itemsize",
        "requires_grad_",
        "retain_grad",
        "register_hook",
        "register_post_accumulate_grad_hook",
        "_backward_hooks",
        "__len__",
        "data_ptr",
        "_post_accumulate_grad_hooks",
        "retains_grad",
        "_cdata",
        "__dir__",
    }
)
# Methods whose results are plain Python values (``tolist`` can be long: not walked).
_VALUE_RESULTS = frozenset(
    {
        "tolist",
        "item",
        "__bool__",
        "__float__",
        "__int__",
        "__index__",
        "__complex__",
        "__format__",
        "__hash__",
    }
)
# Results that cannot hold a tensor's memory.
_PLAIN_RESULTS = (
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.Size,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


def _name(func) -> str:
    name = getattr(func, "__name__", "")
    owner = getattr(func, "__self__", None)
    if name in ("__get__", "__set__", "__delete__") and owner is not None:
        return getattr(owner, "__name__", "")
    return name


def owner_of(tensor):
    """The live owner guarding ``tensor``, or None."""
    owner = tensor.__dict__.get(_OWNER)
    return owner() if owner is not None else None


def _guard_torch_function(cls, func, types, args=(), kwargs=None):
    kwargs = kwargs or {}
    name = _name(func)
    if name in _METADATA:
        with no_guard():
            return func(*args, **kwargs)
    accessed = []
    for value in tree_flatten((args, kwargs))[0]:
        if isinstance(value, _GUARDED):
            owner = owner_of(value)
            if owner is not None:
                owner.before_torch_access(value)
                accessed.append((owner, value))
    with no_guard():
        result = func(*args, **kwargs)
        for owner, value in accessed:
            if name not in _VALUE_RESULTS and _hands_out_memory(result, value):
                owner.memory_handed_out(value)
    return result


def _hands_out_memory(result, tensor) -> bool:
    """Whether ``result`` reaches ``tensor``'s memory: a view, ``.data``, ``.detach()``, the
    tensor itself (in-place ops), a numpy array, a storage or a DLPack capsule of it.
    Caller: under ``no_guard``."""
    storage = None
    for leaf in tree_flatten(result)[0]:
        if isinstance(leaf, torch.Tensor):
            if storage is None:
                storage = tensor.untyped_storage()._cdata
            if leaf.untyped_storage()._cdata == storage:
                return True
        elif leaf is not None and not isinstance(leaf, _PLAIN_RESULTS):
            return True  # numpy arrays, storages, capsules, anything else that may hold it
    return False


@contextlib.contextmanager
def as_plain(tensor):
    """The tensor with its newest value and plain class, e.g. to copy or pickle it."""
    reference = tensor.__dict__.get(_OWNER)
    owner = reference() if reference is not None else None
    if owner is not None:
        owner.before_torch_access(tensor)
    guard = type(tensor)
    tensor.__class__ = _BASE_OF[guard]
    tensor.__dict__.pop(_OWNER, None)
    try:
        yield tensor
    finally:
        tensor.__class__ = guard
        if reference is not None:
            tensor.__dict__[_OWNER] = reference


class _Guard:
    """What both guarded classes add to their base (see the module docstring)."""

    __torch_function__ = classmethod(_guard_torch_function)

    def __deepcopy__(self, memo):
        with as_plain(self):
            return copy.deepcopy(self, memo)

    def __reduce_ex__(self, protocol):
        with as_plain(self):
            return self.__reduce_ex__(protocol)

    def __repr__(self, *args, **kwargs):
        with as_plain(self):
            return self.__repr__(*args, **kwargs)


class GuardedParameter(_Guard, torch.nn.Parameter):  # type: ignore[misc]
    """A parameter whose newest value may live on the JAX side (see module docstring)."""


class GuardedTensor(_Guard, torch.Tensor):  # type: ignore[misc]
    """A state tensor whose newest value may live on the JAX side (see module docstring)."""


_GUARDED = (GuardedParameter, GuardedTensor)
_GUARD_OF = {torch.nn.Parameter: GuardedParameter, torch.Tensor: GuardedTensor}
_BASE_OF = {GuardedParameter: torch.nn.Parameter, GuardedTensor: torch.Tensor}


def plain_type(tensor: torch.Tensor) -> type:
    """The tensor's class as the user made it (a guard is the engine's business only)."""
    return _BASE_OF.get(type(tensor), type(tensor))


def guard(tensor: torch.Tensor, owner) -> None:
    """Guards ``tensor`` for ``owner``, unless it is guarded already (``unguard`` undoes it).
    A tensor subclass of the user's own keeps its class and gets no guard."""
    if type(tensor) in _BASE_OF and tensor.__dict__.get(_OWNER) is not None:
        return
    guard_class = _GUARD_OF.get(type(tensor))
    if guard_class is not None:
        tensor.__dict__[_OWNER] = weakref.ref(owner)
        tensor.__class__ = guard_class  # type: ignore[assignment]
    elif isinstance(tensor, _GUARDED):
        tensor.__dict__[_OWNER] = weakref.ref(owner)


def unguard(tensor: torch.Tensor) -> None:
    """Gives ``tensor`` its plain class back; its owner is no longer told of its use."""
    base = _BASE_OF.get(type(tensor))
    if base is not None:
        tensor.__class__ = base  # type: ignore[assignment]
        tensor.__dict__.pop(_OWNER, None)


def guarded_by(tensor: torch.Tensor, owner) -> bool:
    """Whether ``tensor`` is guarded and ``owner`` is told of its use."""
    return type(tensor) in _BASE_OF and owner_of(tensor) is owner
