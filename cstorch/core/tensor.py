"""``cstorch.tensor``: a stateful tensor, i.e. one the backend carries between steps.

A tensor made with ``cstorch.tensor(...)`` while a backend exists is backend state: a traced
step may update it in place (``t.add_(1)``) and the change persists across steps, like a
buffer of a compiled model. Without a backend it is a plain tensor (with a warning).
"""

from __future__ import annotations

import warnings
import weakref

import torch

from jax_backend.errors import CstorchRuntimeError

_registries: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _StatefulTensors:
    """The stateful tensors of one backend (held weakly: a dropped tensor stops being state)."""

    def __init__(self):
        self.tensors = weakref.WeakValueDictionary()

    def add(self, tensor: torch.Tensor) -> None:
        self.tensors[id(tensor)] = tensor

    def _cstorch_state_slots(self) -> list:
        from jax_backend import Slot

        return [Slot(self.tensors, key) for key in list(self.tensors.keys())]


def _registry(impl) -> _StatefulTensors:
    registry = _registries.get(impl)
    if registry is None:
        registry = _registries[impl] = _StatefulTensors()
        impl.register_stateful(registry)
    return registry


def tensor(*args, **kwargs) -> torch.Tensor:
    """``torch.tensor(*args, **kwargs)`` (or the single tensor argument itself), registered
    as backend state. Creating one inside a traced step raises RuntimeError."""
    from cstorch.backend import current_backend_impl

    impl = current_backend_impl(raise_exception=False)
    single = len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor)
    if impl is None:
        warnings.warn(
            "Constructing a stateful tensor without a backend: it will not be tracked "
            "as backend state. Create the backend first.",
            stacklevel=2,
        )
        return args[0] if single else torch.tensor(*args, **kwargs)
    if impl.is_tracing:
        raise CstorchRuntimeError(
            "Cannot construct a stateful tensor while tracing a step. Construct stateful "
            "tensors during initialization, before the first call of the traced step."
        )
    out = args[0] if single else torch.tensor(*args, **kwargs)
    if out.device.type != impl.torch_device.type:
        out = out.to(impl.torch_device)
    _registry(impl).add(out)
    return out
