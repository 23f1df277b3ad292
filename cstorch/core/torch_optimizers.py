"""torch's own optimizers (``torch.optim.AdamW``, ...) inside a compiled step.

A torch optimizer stepped in a traced step is *adopted* the first time the step is captured:
it registers with the backend like a cstorch optimizer, so its state (``exp_avg``, ``step``,
...) is engine state carried between steps, ``state_dict()`` brings the newest values back,
``load_state_dict`` takes plain copies (never the given dict's tensors, nor a checkpoint's
deferred ones) and ``zero_grad`` counts as zeroing gradients. The capture that finds it stops
(``Unadopted``) and starts again with the optimizer's state in the traced state.

While a step is captured, each torch optimizer step takes torch's own path for compilers
(``torch.compiler.is_compiling()`` is true for its duration, as under ``torch.export``):
``capturable`` (the step count stays a tensor, so its value is never read on the host), the
multi-tensor (``foreach``) code, which the capture decomposes into per-tensor ops, and no
fused kernel. The group values are put back after the step, so checkpoints and
``state_dict()`` keep the user's settings. State torch creates lazily in the first step is
state born in the step (``cstorch.core.born_state``).
"""

from __future__ import annotations

import contextlib
import functools
import weakref

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from jax_backend.errors import CaptureError, CstorchError
from cstorch.backend import current_backend_impl
from cstorch.optim.optimizer import Optimizer as CstorchOptimizer, plain_copies

# Group settings while a torch optimizer step is captured (only where the group has the key).
_CAPTURE_SETTINGS = {"capturable": True, "foreach": True, "fused": None}

# torch optimizers whose step needs values on the host, with what to use instead.
_UNSUPPORTED = {
    "LBFGS": "its line search reads the loss and tensor norms on the host in every step",
    "SparseAdam": "it needs sparse gradients, which a compiled step does not produce",
    "Adafactor": "it reads the step count and tensor norms on the host in every step; use "
                 "cstorch.optim.Adafactor",
}


class Unadopted(CstorchError):
    """A torch optimizer not yet registered with the backend was stepped in a capture: the
    capture stops, the optimizer is adopted and the step captured again."""

    def __init__(self, optimizer):
        super().__init__(f"{type(optimizer).__name__} is not registered with the backend")
        self.optimizer = optimizer


def is_torch_optimizer(optimizer) -> bool:
    return (isinstance(optimizer, torch.optim.Optimizer)
            and not isinstance(optimizer, CstorchOptimizer))


def adopt(impl, optimizer) -> None:
    """Registers a torch optimizer with the backend (module docstring)."""
    if optimizer in impl.optimizer_registry:
        return
    for param, state in list(optimizer.state.items()):  # e.g. loaded: never another's tensors
        optimizer.state[param] = plain_copies(state)
    impl.register_optimizer(optimizer)
    backend = weakref.ref(impl)

    def bring_state_back(_optimizer):
        live = backend()
        if live is not None:
            live.materialize_state()

    def take_plain_copies(_optimizer, state_dict):
        state_dict = dict(state_dict)
        state_dict["state"] = {k: plain_copies(v) for k, v in state_dict["state"].items()}
        return state_dict

    optimizer.register_state_dict_pre_hook(bring_state_back)
    optimizer.register_load_state_dict_pre_hook(take_plain_copies)
    optimizer.zero_grad = functools.partial(_counted_zero_grad, optimizer)


def _counted_zero_grad(optimizer, *args, **kwargs):
    """``zero_grad`` of an adopted torch optimizer: counted as the backend counts cstorch's
    (``GradientAccumulationWarning``), then torch's own."""
    impl = current_backend_impl(raise_exception=False)
    if impl is not None:
        impl.gradient_resets += 1
    return type(optimizer).zero_grad(optimizer, *args, **kwargs)


@contextlib.contextmanager
def capture_policy(impl):
    """Around the step body while it is captured: torch optimizers not yet adopted stop the
    capture (``Unadopted``); adopted ones step on their compiler path (module docstring)."""
    changed = []  # (optimizer, [saved group values], saved compiling flag), innermost last

    def before_step(optimizer, args, kwargs):
        if not is_torch_optimizer(optimizer):
            return None
        name = type(optimizer).__name__
        if name in _UNSUPPORTED and type(optimizer).__module__.startswith("torch.optim"):
            raise CaptureError(
                f"torch.optim.{name} cannot run in a compiled step: {_UNSUPPORTED[name]}. "
                "Use another optimizer (torch.optim or cstorch.optim), or run the step "
                "eagerly (cstorch.backend(\"CPU\", engine=\"eager\")).")
        if optimizer not in impl.optimizer_registry:
            raise Unadopted(optimizer)
        saved = [{k: group[k] for k in _CAPTURE_SETTINGS if k in group}
                 for group in optimizer.param_groups]
        changed.append((optimizer, saved, torch.compiler._is_compiling_flag))
        for group in optimizer.param_groups:
            group.update({k: v for k, v in _CAPTURE_SETTINGS.items() if k in group})
        torch.compiler._is_compiling_flag = True
        return None

    def after_step(optimizer, args, kwargs):
        if changed and changed[-1][0] is optimizer:
            _restore(*changed.pop())

    pre = register_optimizer_step_pre_hook(before_step)
    post = register_optimizer_step_post_hook(after_step)
    try:
        yield
    finally:
        pre.remove()
        post.remove()
        while changed:  # a step that raised: its post hook never ran
            _restore(*changed.pop())


def _restore(optimizer, saved, compiling) -> None:
    for group, values in zip(optimizer.param_groups, saved):
        group.update(values)
    torch.compiler._is_compiling_flag = compiling
