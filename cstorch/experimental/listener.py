"""Hooks on the tensors a traced step creates: ``register_traced_tensor_hook``.

While a ``@cstorch.trace`` step is captured, every tensor produced by a torch function call
in the step is passed to each registered hook as ``hook(tensor, name)``. The name is made of
the current debug scope (``cstorch.set_debug_scope``) and the function's name, with a
``.<n>`` suffix for repeats, so it is stable from one trace to the next. The tensors are
traced (fake) tensors: hooks may inspect shapes and dtypes and record names, not values.
"""

from __future__ import annotations

import collections
import contextlib
import re
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from cstorch.core.name_scope import get_debug_scope

TracedTensorHook = Callable[[torch.Tensor, str], None]
_hooks: "collections.OrderedDict[int, TracedTensorHook]" = collections.OrderedDict()
_NOISY = re.compile(r"^__\w+__$")


def _in_step_body() -> bool:
    from cstorch.backend import current_backend_impl

    impl = current_backend_impl(raise_exception=False)
    return impl is not None and impl.is_tracing


def register_traced_tensor_hook(hook: TracedTensorHook) -> RemovableHandle:
    """Registers ``hook(tensor, name)``, called for each tensor created while a step is
    traced; returns a handle whose ``remove()`` unregisters it."""
    handle = RemovableHandle(_hooks)
    _hooks[handle.id] = hook
    return handle


class _Listener(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.counts = collections.defaultdict(int)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if not _in_step_body():  # the tracer's own work around and after the step body
            return result
        name = getattr(func, "__name__", str(func))
        if _NOISY.match(name) or name in ("clone", "copy", "detach"):
            return result
        for tensor in torch.utils._pytree.tree_leaves(result):
            if isinstance(tensor, torch.Tensor):
                self._announce(tensor, name)
        return result

    def _announce(self, tensor, func_name):
        scope = get_debug_scope()
        base = f"{scope}.{func_name}" if scope else func_name
        count = self.counts[base]
        self.counts[base] += 1
        name = f"{base}.{count}" if count else base
        for hook in list(_hooks.values()):
            hook(tensor, name)


def listening():
    """The context a step is captured in: a listener while any hook is registered."""
    return _Listener() if _hooks else contextlib.nullcontext()


def has_hooks() -> bool:
    """Whether a traced-tensor hook is registered."""
    return bool(_hooks)
