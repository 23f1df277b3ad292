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

The floats of an adopted optimizer's param groups (``lr``, ``betas``, ``weight_decay``, ...)
are runtime inputs of the compiled step (``scalar_slots``, ``jax_backend.scalars``): read at
every call, so a learning rate set by hand or by a torch scheduler between steps needs no new
program. A torch LR scheduler's ``step()`` called in the step body is not traced: it runs on
the host at every call of the compiled step (``deferred_scheduler_steps``), before the
program if the body called it before its optimizer's step, else after it, as eager torch
would run it.
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

from cstorch.backend import current_backend_impl
from cstorch.optim.optimizer import Optimizer as CstorchOptimizer, plain_copies
from jax_backend import scalars
from jax_backend.errors import CaptureError, CstorchError

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
    return isinstance(optimizer, torch.optim.Optimizer) and not isinstance(
        optimizer, CstorchOptimizer
    )


def adopt(impl, optimizer) -> None:
    """Registers a torch optimizer with the backend (module docstring)."""
    if optimizer in impl.registry.optimizers:
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
    """``zero_grad`` of an adopted torch optimizer: told to the backend as cstorch's are
    (``ModesAndHooks.gradients_reset``), then torch's own."""
    impl = current_backend_impl(raise_exception=False)
    if impl is not None:
        set_to_none = kwargs.get("set_to_none", args[0] if args else True)
        impl.modes.gradients_reset(
            [p for group in optimizer.param_groups for p in group["params"]], set_to_none
        )
    return type(optimizer).zero_grad(optimizer, *args, **kwargs)


# ----------------------------------------------------------------------- runtime floats
def scalar_slots(registry) -> list:
    """``(path, ScalarSlot)`` of every float in the param groups of the adopted torch
    optimizers, and of every float element of a tuple or list there (``betas``): the values
    a compiled step takes as inputs. Paths as state paths: ``("optimizer", o, "group", g,
    key)``, with the element's index last for a tuple's."""
    from cstorch.core.state_names import state_name

    entries = []
    for o, optimizer in enumerate(registry.optimizers):
        if not is_torch_optimizer(optimizer):
            continue
        for g, group in enumerate(optimizer.param_groups):
            for key, value in group.items():
                if key == "params":
                    continue
                path = ("optimizer", o, "group", g, key)
                if scalars.is_runtime_scalar(value):
                    entries.append((path, scalars.ScalarSlot(group, key, name=state_name(path))))
                elif isinstance(value, (tuple, list)):
                    entries += [
                        (
                            path + (i,),
                            scalars.ScalarSlot(group, key, i, name=state_name(path + (i,))),
                        )
                        for i, item in enumerate(value)
                        if scalars.is_runtime_scalar(item)
                    ]
    return entries


def read_scalar(registry, path):
    """The float at ``path`` (``scalar_slots``) now, or None if it is no longer there."""
    _, o, _, g, key, *index = path
    try:
        value = registry.optimizers[o].param_groups[g][key]
        if index:
            value = value[index[0]] if isinstance(value, (tuple, list)) else None
    except (IndexError, KeyError, TypeError):
        return None
    return value if scalars.is_runtime_scalar(value) else None


# ---------------------------------------------------------------- during the capture
@contextlib.contextmanager
def capture_policy(registry, stepped: list | None = None):
    """Around the step body while it is captured: torch optimizers not yet adopted stop the
    capture (``Unadopted``); adopted ones step on their compiler path (module docstring).
    Every optimizer stepped is appended to ``stepped``."""
    changed = []  # (optimizer, [saved group values], saved compiling flag), innermost last

    def before_step(optimizer, args, kwargs):
        if stepped is not None and optimizer not in stepped:
            stepped.append(optimizer)
        if not is_torch_optimizer(optimizer):
            return None
        name = type(optimizer).__name__
        if name in _UNSUPPORTED and type(optimizer).__module__.startswith("torch.optim"):
            raise CaptureError(
                f"torch.optim.{name} cannot run in a compiled step: {_UNSUPPORTED[name]}. "
                "Use another optimizer (torch.optim or cstorch.optim), or run the step "
                'eagerly (cstorch.backend("CPU", engine="eager")).'
            )
        if optimizer not in registry.optimizers:
            raise Unadopted(optimizer)
        saved = [
            {k: group[k] for k in _CAPTURE_SETTINGS if k in group}
            for group in optimizer.param_groups
        ]
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


# ------------------------------------------------------------------ torch LR schedulers
def _scheduler_step_owners() -> list:
    """torch's LR scheduler classes (and their subclasses, the user's included) that define
    their own ``step``."""
    from torch.optim.lr_scheduler import LRScheduler

    found, pending = [], [LRScheduler]
    while pending:
        cls = pending.pop()
        if "step" in cls.__dict__:
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


@contextlib.contextmanager
def deferred_scheduler_steps(stepped: list, calls: list):
    """While the step body is captured: a torch LR scheduler's ``step()`` is not run but
    recorded in ``calls`` as ``(phase, scheduler, args, kwargs)``, to run on the host at
    every call of the compiled step: "before" its program if the body had not stepped the
    scheduler's optimizer yet (``stepped``), else "after" (module docstring).
    ``ReduceLROnPlateau`` reads the metric it is given: it runs, and reading the traced
    value fails with the error that says so."""
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    owners = _scheduler_step_owners()
    originals = {cls: cls.__dict__["step"] for cls in owners}

    def deferring(original):
        @functools.wraps(original)
        def step(scheduler, *args, **kwargs):
            if isinstance(scheduler, ReduceLROnPlateau):
                return original(scheduler, *args, **kwargs)
            optimizer = getattr(scheduler, "optimizer", None)
            phase = "after" if any(optimizer is o for o in stepped) else "before"
            calls.append((phase, scheduler, args, kwargs))
            return None

        return step

    for cls, original in originals.items():
        cls.step = deferring(original)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.step = original


def run_scheduler_steps(calls: list, phase: str) -> None:
    """Runs the recorded scheduler steps of ``phase`` (``deferred_scheduler_steps``)."""
    for when, scheduler, args, kwargs in calls:
        if when == phase:
            scheduler.step(*args, **kwargs)
