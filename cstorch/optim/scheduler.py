"""Schedulers of optimizer hyperparameters, in closed form of the step counter.

A scheduler's only state is ``last_epoch``, an int64 tensor, so the whole schedule can live in
the compiled step. Built-in schedulers describe themselves with a JSON-able config
(``_schedule_config``) and their value is the ``cstorch::schedule`` op, i.e. the pure function
from ``jax_backend.schedules`` (also available to JAX users as ``scheduler.schedule_fn``).
User schedulers override ``_get_closed_form()`` with torch ops (the older name
``_get_closed_form_lr`` is accepted too).

The value is written into each targeted param group in place, so ``group["lr"]`` is a 0-dim
tensor right after construction (cerebras-pytorch semantics).
"""

from __future__ import annotations

import warnings
import weakref
from abc import ABC, abstractmethod
from functools import wraps
from typing import List, Optional, Union

import numpy
import torch

import jax_backend
from jax_backend import Slot
from jax_backend.torch_ops import schedule_config
from cstorch.backend import current_backend_impl

Tags = Optional[Union[str, List[str]]]


class _GetWithinStep:
    def __init__(self, scheduler):
        self.scheduler = scheduler

    def __enter__(self):
        self.scheduler._get_called_within_step = True

    def __exit__(self, *exc):
        self.scheduler._get_called_within_step = False


def _counting(method):
    """Wraps ``optimizer.step`` to count calls (torch's LR-scheduler protocol)."""
    if getattr(method, "_with_counter", False):
        return method
    instance_ref = weakref.ref(method.__self__)
    func = method.__func__

    @wraps(func)
    def wrapper(*args, **kwargs):
        instance = instance_ref()
        instance._step_count += 1
        return func.__get__(instance, type(instance))(*args, **kwargs)

    wrapper._with_counter = True
    return wrapper


class Scheduler(ABC):
    """Base class (see module docstring). ``param_group_key`` names the scheduled value."""

    def __init__(self, optimizer, total_iters, last_epoch: int = -1, param_group_tags: Tags = None):
        from cstorch.optim.optimizer import Optimizer

        self.device = None
        if param_group_tags is None:
            self.param_group_tags = None
        elif isinstance(param_group_tags, (list, tuple, set)):
            self.param_group_tags = set(param_group_tags)
            if len(self.param_group_tags) != len(param_group_tags):
                raise ValueError(f"`param_group_tags` contains duplicate values. Tag list: "
                                 f"{param_group_tags}.")
        else:
            self.param_group_tags = {param_group_tags}
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an a cstorch.optim.Optimizer")
        self._last_value = [group.get(self.param_group_key) for group in optimizer.param_groups]
        self.total_iters = total_iters
        self.optimizer = optimizer
        self._validate_tags_apply()
        self.last_epoch = last_epoch
        self.optimizer.step = _counting(self.optimizer.step)
        self.optimizer._step_count = 0
        self._step_count = 0
        self.step()
        current_backend_impl().setup_scheduler(self)
        self._get_called_within_step = False
        self._post_init()

    def _post_init(self):
        self.update_last_value()

    @property
    @abstractmethod
    def param_group_key(self) -> str:
        """The param-group entry this scheduler writes, e.g. "lr" or "weight_decay"."""

    def _should_apply_to_param_group(self, group) -> bool:
        if self.param_group_tags is None:
            return True
        tags = group.get("tags")
        return bool(tags) and bool(self.param_group_tags.intersection(tags))

    def _validate_tags_apply(self):
        available = set()
        for group in self.optimizer.param_groups:
            if self._should_apply_to_param_group(group):
                return
            available.update(group.get("tags") or ())
        raise ValueError(
            f"Scheduler {type(self).__name__} was created with `param_group_tags` "
            f"{self.param_group_tags} but none of them were applied to any params groups in "
            f"the optimizer. Please check the correctness of the param group tags. Available "
            f"tags: {available}.")

    # ---------------------------------------------------------------------------- values
    def _schedule_config(self) -> Optional[dict]:
        """The ``jax_backend.schedules`` config of this schedule (None: torch closed form)."""
        return None

    @property
    def schedule_fn(self):
        """This schedule as a pure JAX function ``count -> value`` (optax-compatible)."""
        config = self._schedule_config()
        if config is None:
            raise NotImplementedError(
                f"{type(self).__name__} is defined by torch ops only and has no JAX form.")
        return jax_backend.schedules.from_config(config)

    def _get_closed_form(self):
        if type(self)._get_closed_form_lr is not Scheduler._get_closed_form_lr:
            return self._get_closed_form_lr()
        config = self._schedule_config()
        if config is None:
            raise NotImplementedError(
                f"{type(self).__name__} must implement _get_closed_form() returning a 0-dim "
                "tensor computed from self.last_epoch.")
        return torch.ops.cstorch.schedule(schedule_config(config), self.last_epoch)

    def _get_closed_form_lr(self):
        """Older name of ``_get_closed_form`` (kept for user schedulers written against it)."""
        raise NotImplementedError

    def get(self):
        if not self._get_called_within_step:
            warnings.warn("To get the last value computed by the scheduler, please use "
                          "`get_last_value()`.", stacklevel=2)
        value = self._get_closed_form()
        return [value if self._should_apply_to_param_group(g) else None
                for g in self.optimizer.param_groups]

    def increment_last_epoch(self):
        if isinstance(self.last_epoch, torch.Tensor):
            self.last_epoch.add_(1)
        else:
            self.last_epoch += 1

    def step(self, *args, **kwargs):
        self.increment_last_epoch()
        self._step_count += 1
        if self._step_count == 1:
            return  # the implicit step of the constructor computes nothing
        self.update_last_value()

    def update_last_value(self):
        with _GetWithinStep(self):
            values = self.get()
        for group, value in zip(self.optimizer.param_groups, values):
            if value is not None:
                _write_group_value(group, self.param_group_key, value)

    def get_last_value(self):
        current_backend_impl().materialize_state()
        self._last_value = [group[self.param_group_key] if self._should_apply_to_param_group(group)
                            else None for group in self.optimizer.param_groups]
        return self._last_value

    # ------------------------------------------------------------------------- state
    def _cstorch_state_slots(self):
        return [Slot(self.__dict__, "last_epoch")] if isinstance(
            self.last_epoch, torch.Tensor) else []

    def state_dict(self):
        self.get_last_value()
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "device")}

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        state_dict.pop("_step_count", None)
        self.__dict__.update(state_dict)
        self._validate_tags_apply()
        current_backend_impl().setup_scheduler(self)


def _write_group_value(group, key, value):
    """Writes a scheduled value into a param group, in place when the slot is already a tensor
    (a traced step then records it as a state update)."""
    current = group.get(key)
    if (isinstance(current, torch.Tensor) and current.shape == value.shape
            and current.dtype == value.dtype):
        with torch.no_grad():
            current.copy_(value)
    else:
        group[key] = value.detach().clone()


def _alias(name):
    """A property storing a base-class attribute under its LR-specific name."""
    return property(lambda self: getattr(self, name),
                    lambda self, value: setattr(self, name, value))


# ------------------------------------------------------------------------ built-in schedules
class ConstantScheduler(Scheduler):
    def __init__(self, optimizer, val, total_iters=None, param_group_tags: Tags = None):
        self.val = val
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _schedule_config(self):
        return {"kind": "constant", "value": float(self.val)}


class PolynomialScheduler(Scheduler):
    """``end`` for ``t >= total_iters``, else ``(initial-end)(1-t/T)^power + end``."""

    def __init__(self, optimizer, initial_val, end_val, total_iters, power=1.0, cycle=False,
                 param_group_tags: Tags = None):
        self.initial_val = initial_val
        self.end_val = end_val
        self.power = power
        self.cycle = cycle
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _schedule_config(self):
        return {"kind": "polynomial", "initial": float(self.initial_val),
                "end": float(self.end_val), "total_iters": self.total_iters,
                "power": float(self.power), "cycle": bool(self.cycle)}


class LinearScheduler(PolynomialScheduler):
    def __init__(self, optimizer, initial_val, end_val, total_iters, cycle=False,
                 param_group_tags: Tags = None):
        super().__init__(optimizer, initial_val, end_val, total_iters, power=1.0, cycle=cycle,
                         param_group_tags=param_group_tags)


class CosineDecayScheduler(Scheduler):
    """``end + (initial-end)·½(1+cos(π·min(t,T)/T))``."""

    def __init__(self, optimizer, initial_val, end_val, total_iters,
                 param_group_tags: Tags = None):
        self.initial_val = initial_val
        self.end_val = end_val
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _schedule_config(self):
        return {"kind": "cosine_decay", "initial": float(self.initial_val),
                "end": float(self.end_val), "total_iters": self.total_iters}


class SequentialScheduler(Scheduler):
    """``schedulers[k]`` runs from ``milestones[k-1]``, its own count restarting at 0."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1,
                 param_group_tags: Tags = None):
        if isinstance(milestones, numpy.ndarray):
            milestones = milestones.tolist()
        if not isinstance(milestones, (list, tuple)) or any(
                not isinstance(m, int) or isinstance(m, bool) for m in milestones):
            raise TypeError(f"Expected milestones to be a list of integers. Got: {milestones!r}")
        for index, scheduler in enumerate(schedulers):
            if scheduler.optimizer is not optimizer:
                raise ValueError(
                    f"Sequential Schedulers expects all schedulers to belong to the same "
                    f"optimizer, but got schedulers at index {index} to be different than the "
                    f"optimizer passed in.")
            if scheduler.param_group_key != self.param_group_key:
                raise ValueError(
                    f"Sequential Schedulers expects all schedulers to have the same "
                    f"`param_group_key`, but got schedulers `param_group_key` at index {index} "
                    "to be different than the Sequential Scheduler's `param_group_key`.")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"Sequential Schedulers expects number of schedulers provided to be one more "
                f"than the number of milestone points, but got number of schedulers "
                f"{len(schedulers)} and the number of milestones to be equal to "
                f"{len(milestones)}")
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        for scheduler in schedulers:
            optimizer._schedulers_registry.pop(scheduler, None)
        super().__init__(optimizer, total_iters=None, last_epoch=last_epoch,
                         param_group_tags=param_group_tags)

    def _post_init(self):
        for index, scheduler in enumerate(self._schedulers):
            if scheduler.param_group_tags != self.param_group_tags:
                raise ValueError(
                    f"Sequential Schedulers expects all schedulers to have the same "
                    f"`param_group_tags`, but found `param_group_tags` at index {index} to be "
                    "different than the Sequential Scheduler's `param_group_tags.")
        super()._post_init()

    def _schedule_config(self):
        children = [s._schedule_config() for s in self._schedulers]
        if any(c is None for c in children):
            return None
        return {"kind": "sequential", "schedules": children, "milestones": self._milestones}

    def _get_closed_form(self):
        value = self._schedulers[0]._get_closed_form()
        for index, milestone in enumerate(self._milestones):
            value = torch.where(self.last_epoch < milestone, value,
                                self._schedulers[index + 1]._get_closed_form())
        return value

    def increment_last_epoch(self):
        super().increment_last_epoch()
        if self._step_count == 0:
            return  # the children took their own initial step when they were built
        self._schedulers[0].increment_last_epoch()
        for index, milestone in enumerate(self._milestones):
            child = self._schedulers[index + 1]
            child.last_epoch.add_(torch.where(self.last_epoch <= milestone, 0, 1))

    def state_dict(self):
        state = super().state_dict()
        state["_schedulers"] = [s.state_dict() for s in state.pop("_schedulers")]
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        children = state_dict.pop("_schedulers")
        super().load_state_dict(state_dict)
        for child, child_state in zip(self._schedulers, children):
            child.load_state_dict(child_state)
            self.optimizer._schedulers_registry.pop(child, None)

