"""Deferred tensors: ``torch.Tensor`` subclasses whose data is read from a file on first use.

``cstorch.load`` returns a :class:`DeferredTorchTensor` for every stored tensor. It has the
stored shape and dtype but no storage; the first torch operation on it reads its dataset (and
only its dataset) from the checkpoint. Like the reference:

* the value is cached only when ``map_location="cache"`` was given, or once the tensor is
  modified in place, viewed (a view must see later writes), or handed out through ``numpy()``;
  otherwise every use re-reads the file, which keeps memory flat when tensors are copied once
  into a model (``load_state_dict``);
* before reading, the backing file is checked: if it changed since the load, a RuntimeError
  says so (``with check_deferred_backing_storage(False):`` turns the check off);
* pickling (``torch.save``) and ``copy.deepcopy`` of an unmodified tensor produce a plain tensor
  and a new deferred tensor respectively.

Unlike the reference, which allocates a real (uninitialized) tensor of the full size as the
subclass's storage, we use ``_make_wrapper_subclass``: a deferred tensor costs no memory at all
until it is read. The exception is a small byte vector (a torch generator state: 5056 bytes on
CPU), which is read when loaded and keeps its value in its own memory, as if loaded with
``map_location="cache"``: ``torch.set_rng_state`` (and ``torch.cuda.set_rng_state``) read a
tensor's memory directly, without torch dispatch, so ``torch.set_rng_state(cstorch.load(p)
["rng"])`` needs the value there (torch's functions themselves are left as they are).
"""

from __future__ import annotations

import copy
import os
import threading
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import torch
from torch.utils._pytree import tree_map
from torch.utils.hooks import RemovableHandle

from cstorch.storage import conversions
from jax_backend.errors import CstorchRuntimeError, CstorchValueError, quoted


class BooleanContext:
    """A process-wide boolean flag that is also a context manager: ``with flag(False): ...``."""

    def __init__(self, default: bool):
        self._value = bool(default)
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return self._value

    def __repr__(self) -> str:
        return f"BooleanContext({self._value})"

    @contextmanager
    def __call__(self, value: bool):
        with self._lock:
            previous, self._value = self._value, bool(value)
        try:
            yield self
        finally:
            self._value = previous


#: Whether deferred tensors created by a load keep their value once read.
cache_deferred_tensors = BooleanContext(True)
#: Whether reading a deferred tensor first checks that its file did not change since the load.
check_deferred_backing_storage = BooleanContext(True)
#: Reference flags kept for API compatibility; they only matter on the wafer (CSX).
use_external_link = BooleanContext(False)
use_cstorch_types = BooleanContext(False)
saving_initial_state = BooleanContext(False)
materialize_deferred_tensors = BooleanContext(False)


_FILE_CHANGED = (
    "Attempting to {action}, but the file has since been modified. The loaded tensor value may "
    "differ from what was originally loaded; refrain from modifying checkpoint files while a run "
    "uses them. If this is a false positive (some filesystems report unreliable timestamps), "
    "disable the check with:\n"
    "    with cstorch.storage.serializers.check_deferred_backing_storage(False):\n"
    "        ...  # code that materializes the tensor\n"
)


class DeferredTensor(torch.Tensor):
    """Base class: a tensor that knows how to produce its value (``_to_cpu``) when needed."""

    def __init__(self):
        super().__init__()

    @staticmethod
    def _make(cls, shape, dtype):
        return torch.Tensor._make_wrapper_subclass(
            cls,
            tuple(int(s) for s in shape),
            dtype=dtype or torch.get_default_dtype(),
            device="cpu",
            requires_grad=False,
        )

    def _init_deferred(self) -> None:
        self._tensor: torch.Tensor | None = None
        self._is_dirty = False
        self._cache_tensor = bool(cache_deferred_tensors)
        self._post_materialize_hooks: OrderedDict = OrderedDict()

    # -- subclass interface ----------------------------------------------------------------------

    def _to_cpu(self) -> torch.Tensor:
        raise NotImplementedError

    def _clone(self) -> "DeferredTensor":
        raise NotImplementedError

    # -- materialization -------------------------------------------------------------------------

    def register_post_materialize_hook(
        self, hook: Callable[[torch.Tensor], Any]
    ) -> RemovableHandle:
        """``hook(tensor) -> tensor | None`` runs on every materialization."""
        if not callable(hook):
            raise CstorchValueError("Hook must be callable.")
        handle = RemovableHandle(self._post_materialize_hooks)
        self._post_materialize_hooks[handle.id] = hook
        return handle

    @property
    def is_modified(self) -> bool:
        """True once the tensor was materialized and (possibly) modified."""
        return self._tensor is not None and self._is_dirty

    @property
    def is_materialized(self) -> bool:
        return self._tensor is not None

    def _materialize(self, cache_override: bool | None = None) -> torch.Tensor:
        tensor = self._tensor if self._tensor is not None else self._to_cpu()
        if tensor.requires_grad != self.requires_grad and tensor.is_leaf:
            tensor.requires_grad_(self.requires_grad)
        cache = self._cache_tensor if cache_override is None else cache_override
        if cache:
            self._tensor = tensor
        for hook in self._post_materialize_hooks.values():
            out = hook(tensor)
            if out is not None:
                tensor = out
        return tensor

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handles: list = []

        def unwrap(value):
            if isinstance(value, DeferredTensor):
                real = value._materialize()
                handles.append((value, real))
                return real
            return value

        result = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if handles:
            written, aliased = _written_and_aliased(func, args, kwargs)
            for deferred, real in handles:
                # Keep the value of a tensor that was written to, or that a result aliases, so
                # later reads see the change.
                if any(deferred is w for w in written):
                    deferred._tensor, deferred._is_dirty, deferred._cache_tensor = real, True, True
                elif any(deferred is a for a in aliased):
                    deferred._tensor, deferred._cache_tensor = real, True
        return result

    # Without this, torch would wrap results of Python-level ops back into the subclass.
    __torch_function__ = torch._C._disabled_torch_function_impl

    # -- torch.Tensor methods that need the value --------------------------------------------------

    def numpy(self, *, force: bool = False) -> np.ndarray:
        # The array shares memory with the value: keep it, and assume it may be written.
        self._is_dirty = True
        return self._materialize(cache_override=True).detach().numpy(force=force)

    def tolist(self):
        return self._materialize().tolist()

    def item(self):
        return self._materialize().item()

    def __array__(self, dtype=None, copy=None):
        array = self._materialize().detach().numpy()
        return array if dtype is None else array.astype(dtype)

    def clone(self, *args, **kwargs):
        if not self.is_modified and not args and not kwargs:
            cloned = self._clone()
            cloned.requires_grad_(self.requires_grad)
            return cloned
        return super().clone(*args, **kwargs)

    def __deepcopy__(self, memo):
        if not self.is_modified:
            return memo.setdefault(id(self), self._clone())
        return copy.deepcopy(self._materialize(), memo)

    def __reduce_ex__(self, protocol):
        # torch.save / pickle get a plain tensor, so files do not depend on this class.
        return self._materialize().__reduce_ex__(protocol)

    def __repr__(self, *, tensor_contents=None):
        return repr(self._materialize())

    def __format__(self, spec):
        return format(self._materialize(), spec)


def _written_and_aliased(func, args, kwargs):
    """The arguments an ATen op writes to, and those its results alias (views)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return [], []
    written, aliased = [], []
    returns_alias = any(r.alias_info is not None for r in schema.returns)
    for index, argument in enumerate(schema.arguments):
        value = args[index] if index < len(args) else kwargs.get(argument.name)
        if argument.alias_info is None or not isinstance(value, torch.Tensor):
            continue
        if argument.alias_info.is_write:
            written.append(value)
        elif returns_alias:
            aliased.append(value)
    return written, aliased


#: Byte vectors up to this many bytes are read when loaded (see the module docstring).
READ_AT_LOAD_BYTES = 64 * 1024


def _read_at_load(shape, dtype) -> bool:
    return dtype == torch.uint8 and len(shape) == 1 and int(shape[0]) <= READ_AT_LOAD_BYTES


class DeferredTorchTensor(DeferredTensor):
    """A tensor stored in a checkpoint dataset, read on first use."""

    @staticmethod
    def __new__(cls, deferred, shape, dtype):
        if not _read_at_load(shape, dtype):
            return DeferredTensor._make(cls, shape, dtype)
        value = _checked_read(deferred, shape, dtype)
        tensor = torch.Tensor._make_subclass(cls, value)  # shares value's memory
        tensor._value_read_at_load = value
        return tensor

    def __init__(self, deferred, shape, dtype):
        super().__init__()
        self._init_deferred()
        value = self.__dict__.pop("_value_read_at_load", None)
        if value is not None:  # its memory is this tensor's: every op must use (and edit) it
            self._tensor, self._cache_tensor = value, True
        #: The stored value this tensor reads (a :class:`DeferredObject`).
        self.deferred = deferred

    def _to_cpu(self) -> torch.Tensor:
        return _checked_read(self.deferred, self.shape, self.dtype)

    def _clone(self) -> "DeferredTorchTensor":
        self.deferred.check_unchanged(f"clone deferred tensor with key {quoted(self.deferred.key)}")
        cloned = DeferredTorchTensor(self.deferred, self.shape, self.dtype)
        cloned._cache_tensor = self._cache_tensor
        return cloned


class DeferredFullTensor(DeferredTensor):
    """A tensor filled with one value (``None`` = uninitialized), created when first used."""

    @staticmethod
    def __new__(cls, size, dtype=None, value=None):
        return DeferredTensor._make(cls, size, dtype)

    def __init__(self, size, dtype=None, value=None):
        super().__init__()
        self._init_deferred()
        self._value = value

    @property
    def fill_value(self):
        return self._value

    def _to_cpu(self) -> torch.Tensor:
        if self._value is None:
            return torch.empty(self.shape, dtype=self.dtype)
        return torch.full(self.shape, self._value, dtype=self.dtype)

    def _clone(self) -> "DeferredFullTensor":
        return DeferredFullTensor(self.shape, self.dtype, self._value)


class DeferredSafeTensor(DeferredTensor):
    """A tensor stored under ``key`` in a safetensors file, read (alone) on first use."""

    @staticmethod
    def __new__(cls, path, key, fp=None):
        from cstorch.storage import safetensors_format

        table = safetensors_format.entries(path)
        if key not in table:
            raise KeyError(f"safetensors file '{path}' has no tensor {quoted(key)}.")
        dtype, shape, _ = table[key]
        return DeferredTensor._make(cls, shape, dtype)

    def __init__(self, path, key, fp=None):
        super().__init__()
        self._init_deferred()
        self.path, self.key = os.fspath(path), key
        self._stamp = _file_stamp(self.path)

    @staticmethod
    def load_file(path) -> dict:
        """Every tensor of a safetensors file, each read only when used."""
        from cstorch.storage import safetensors_format

        return {key: DeferredSafeTensor(path, key) for key in safetensors_format.entries(path)}

    def _to_cpu(self) -> torch.Tensor:
        from cstorch.storage import safetensors_format

        _check_stamp(self.path, self._stamp, f"materialize tensor {self.key!r}")
        return safetensors_format.read_tensor(self.path, self.key)

    def _clone(self) -> "DeferredSafeTensor":
        return DeferredSafeTensor(self.path, self.key)


class DeferredFileTensor(DeferredTensor):
    """Deprecated: a tensor stored as raw little-endian values in a file of its own."""

    @staticmethod
    def __new__(cls, filepath, size, dtype):
        return DeferredTensor._make(cls, size, dtype)

    def __init__(self, filepath, size, dtype):
        super().__init__()
        warnings.warn(
            "DeferredFileTensor is deprecated; use DeferredTorchTensor or DeferredSafeTensor.",
            DeprecationWarning,
            stacklevel=2,
        )
        self._init_deferred()
        self.filepath = os.fspath(filepath)
        self._stamp = _file_stamp(self.filepath)

    def _to_cpu(self) -> torch.Tensor:
        _check_stamp(self.filepath, self._stamp, "materialize a file tensor")
        storage = torch.int16 if self.dtype is torch.bfloat16 else self.dtype
        array = np.fromfile(
            self.filepath,
            dtype=torch.empty(0, dtype=storage).numpy().dtype,
            count=int(np.prod(self.shape, dtype=np.int64)),
        )
        tensor = torch.from_numpy(array.reshape(tuple(self.shape)))
        return tensor.view(torch.bfloat16) if self.dtype is torch.bfloat16 else tensor

    def _clone(self) -> "DeferredFileTensor":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return DeferredFileTensor(self.filepath, self.shape, self.dtype)


class DeferredGraphTensor(DeferredTensor):
    """A tensor computed on first use by a TorchScript graph (IR text or graph) from ``args``."""

    @staticmethod
    def __new__(cls, jit_graph, args, size, dtype=None):
        return DeferredTensor._make(cls, size, dtype)

    def __init__(self, jit_graph, args, size, dtype=None):
        super().__init__()
        self._init_deferred()
        self.jit_graph = jit_graph
        self.args = list(args)

    def _to_cpu(self) -> torch.Tensor:
        graph = (
            torch._C.parse_ir(self.jit_graph)
            if isinstance(self.jit_graph, str)
            else (self.jit_graph)
        )
        function = torch._C._create_function_from_graph("deferred_graph_tensor", graph)
        args = [a._materialize() if isinstance(a, DeferredTensor) else a for a in self.args]
        value = function(*args)
        if tuple(value.shape) != tuple(self.shape):
            raise CstorchRuntimeError(
                f"The graph of a DeferredGraphTensor produced shape "
                f"{tuple(value.shape)}, expected {tuple(self.shape)}."
            )
        return value.to(self.dtype)

    def _clone(self) -> "DeferredGraphTensor":
        return DeferredGraphTensor(self.jit_graph, self.args, self.shape, self.dtype)


def _file_stamp(path):
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def _check_stamp(path, stamp, what):
    if check_deferred_backing_storage and _file_stamp(path) != stamp:
        raise CstorchRuntimeError(_FILE_CHANGED.format(action=f"{what} from '{path}'"))


class DeferredObject:
    """A value stored under ``key`` of an open checkpoint: where it is and its metadata.

    ``read_tensor`` / ``read_array`` / ``read_bytes`` read it. Dataset attributes take precedence
    over the JSON metadata, as in the reference reader.
    """

    def __init__(self, reader, key: str, metadata: dict | None = None):
        self.reader, self.key = reader, key
        self.metadata = dict(metadata or {})

    @property
    def path(self) -> str:
        return self.reader.path

    def merged_metadata(self) -> dict:
        return {**self.metadata, **self.reader.dataset_metadata(self.key)}

    def check_unchanged(self, action: str) -> None:
        if check_deferred_backing_storage and self.reader.changed_since_open():
            raise CstorchRuntimeError(_FILE_CHANGED.format(action=f"{action} from '{self.path}'"))

    def read_array(self) -> np.ndarray:
        return self.reader.read_array(self.key)

    def read_bytes(self) -> bytes:
        data = self.reader.read_bytes(self.key)
        if data is None:
            raise CstorchRuntimeError(
                f"Key {self.key!r} of checkpoint '{self.path}' has no __BYTES__ "
                "payload: the file is corrupt or incomplete."
            )
        return data

    def read_tensor(self, dtype: torch.dtype) -> torch.Tensor:
        metadata = self.merged_metadata()
        if metadata.get("__RTFX__"):
            shape = metadata["shapes"][0]
            array = conversions.rtfx_bytes_to_array(
                self.read_bytes(), shape, metadata["rtfx_dtypes"][0]
            )
        else:
            array = self.read_array()
        return conversions.array_to_tensor(array, dtype)

    def __repr__(self) -> str:
        return f"DeferredObject(path={self.path!r}, key={self.key!r})"


def _checked_read(deferred: DeferredObject, shape, dtype) -> torch.Tensor:
    deferred.check_unchanged(f"materialize deferred tensor with key {quoted(deferred.key)}")
    value = deferred.read_tensor(dtype)
    if tuple(value.shape) != tuple(shape):
        raise CstorchRuntimeError(
            f"Key {quoted(deferred.key)} of checkpoint '{deferred.path}' holds shape "
            f"{tuple(value.shape)} but its metadata says {tuple(shape)}: corrupt file."
        )
    return value
