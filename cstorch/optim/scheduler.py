"""Schedulers of optimizer hyperparameters, in closed form of the step counter.

A scheduler's only state is ``last_epoch``, an int64 tensor, so the whole schedule can live in
the compiled step. Built-in schedulers describe themselves with a JSON-able config
(``_schedule_config``) and their value is the ``cstorch::schedule`` op, i.e. the pure function
from ``jax_backend.schedules`` (also available to JAX users as ``scheduler.schedule_fn``).
User schedulers override ``_get_closed_form()`` with torch ops on ``self.last_epoch`` (the
older name ``_get_closed_form_lr`` is accepted too).

The value is written into each targeted param group in place, so ``group["lr"]`` is a 0-dim
float32 tensor right after construction (cerebras-pytorch semantics) and a traced step records
the write as a state update.

Where ``jax_backend.schedules`` corrects a cerebras-pytorch 2.10 bug, the scheduler follows
the corrected closed form (``PolynomialScheduler(cycle=True)``,
``CosineAnnealingWarmRestartsScheduler``, ``LambdaScheduler``); each class says how it differs.
"""

import numbers
import warnings
import weakref
from abc import ABC, abstractmethod
from functools import wraps
from typing import List, Optional, Union

import numpy
import torch

import jax_backend
from cstorch.backend import current_backend_impl
from cstorch.optim.optimizer import plain_copies
from jax_backend import Slot
from jax_backend.errors import (
    CstorchNotImplementedError,
    CstorchRuntimeError,
    CstorchTypeError,
    CstorchValueError,
)
from jax_backend.torch_ops import schedule_config

Tags = Optional[Union[str, List[Optional[str]]]]


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


def _number(value):
    """A JSON-able Python number (numpy and 0-dim tensor scalars are converted)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        if isinstance(value, (torch.Tensor, numpy.ndarray, numpy.generic)):
            value = value.item()
        else:
            return value  # left for jax_backend.schedules to reject with a clear message
    return value if isinstance(value, (int, float)) else float(value)


class Scheduler(ABC):
    """Schedules one param-group value (``param_group_key``) of a cstorch optimizer.

    Construction: tags are validated (they must match at least one group; ``[None]``
    targets the untagged groups), ``optimizer.step`` is wrapped to count calls, one implicit
    ``step()`` takes ``last_epoch`` from -1 to 0, the backend turns ``last_epoch`` into an int64
    tensor, and the value at step 0 is written into the targeted groups.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_iters: int,
        last_epoch: int = -1,
        param_group_tags: Tags = None,
    ):
        from cstorch.optim.optimizer import Optimizer

        self.device = None
        if param_group_tags is None:
            self.param_group_tags = None
        elif isinstance(param_group_tags, (list, tuple, set)):
            self.param_group_tags = set(param_group_tags)
            if len(self.param_group_tags) != len(param_group_tags):
                raise CstorchValueError(
                    f"`param_group_tags` contains duplicate values. Tag list: {param_group_tags}."
                )
        else:
            self.param_group_tags = {param_group_tags}
        if not isinstance(optimizer, Optimizer):
            raise CstorchTypeError(
                f"{type(optimizer).__name__} is not a cstorch.optim.Optimizer; schedulers "
                "drive cstorch optimizers only (e.g. cstorch.optim.SGD, not torch.optim.SGD)."
            )
        self._last_value = [group.get(self.param_group_key) for group in optimizer.param_groups]
        self.total_iters = total_iters
        self.optimizer = optimizer
        self._validate_tags_apply()
        self.last_epoch = last_epoch
        self.optimizer.step = _counting(self.optimizer.step)
        self.optimizer._step_count = 0
        self._step_count = 0
        self._get_called_within_step = False
        self.step()
        current_backend_impl().setup_scheduler(self)
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
        tags = group.get("tags", {None})  # an untagged group counts as tagged None
        return bool(tags) and bool(self.param_group_tags.intersection(tags))

    def _validate_tags_apply(self):
        available = set()
        for group in self.optimizer.param_groups:
            if self._should_apply_to_param_group(group):
                return
            available.update(group.get("tags") or ())
        raise CstorchValueError(
            f"Scheduler {type(self).__name__} was created with `param_group_tags` "
            f"{self.param_group_tags} but none of them were applied to any params groups in "
            f"the optimizer. Please check the correctness of the param group tags. Available "
            f"tags: {available}."
        )

    # ---------------------------------------------------------------------------- values
    def _schedule_config(self) -> Optional[dict]:
        """The ``jax_backend.schedules`` config of this schedule (None: torch closed form),
        built from the class's row of ``_SCHEDULE_TABLE``."""
        row = next(
            (_SCHEDULE_TABLE[cls] for cls in type(self).__mro__ if cls in _SCHEDULE_TABLE), None
        )
        if row is None:
            return None
        kind, arguments = row
        config = {"kind": kind}
        for argument, source in arguments.items():
            attribute, convert = source if isinstance(source, tuple) else (source, _number)
            config[argument] = convert(getattr(self, attribute))
        return config

    def _pure_config(self) -> Optional[dict]:
        """``_schedule_config()``, or None when a subclass computes its value with its own
        torch ops (overriding ``_get_closed_form``), so the config would not describe it."""
        cls = type(self)
        if (
            cls._get_closed_form.__module__ != __name__
            or cls._get_closed_form_lr is not Scheduler._get_closed_form_lr
        ):
            return None
        return self._schedule_config()

    @property
    def schedule_fn(self):
        """This schedule as a pure JAX function ``count -> value`` (optax-compatible)."""
        config = self._pure_config()
        if config is None:
            raise CstorchNotImplementedError(
                f"{type(self).__name__} is defined by torch ops only (its _get_closed_form) "
                "and has no JAX form."
            )
        return jax_backend.schedules.from_config(config)

    def _get_closed_form(self):
        """The value at ``self.last_epoch`` as a 0-dim tensor, computed only from
        ``last_epoch`` and constructor arguments (override with torch ops)."""
        if type(self)._get_closed_form_lr is not Scheduler._get_closed_form_lr:
            return self._get_closed_form_lr()
        config = self._schedule_config()
        if config is None:
            raise CstorchNotImplementedError(
                f"{type(self).__name__} must implement _get_closed_form() returning a 0-dim "
                "tensor computed from self.last_epoch."
            )
        return torch.ops.cstorch.schedule(schedule_config(config), self.last_epoch)

    def _get_closed_form_lr(self):
        """Older name of ``_get_closed_form`` (kept for user schedulers written against it)."""
        raise NotImplementedError

    def get(self):
        """The value for each param group (None for groups the tags exclude)."""
        if not self._get_called_within_step:
            warnings.warn(
                "To get the last value computed by the scheduler, please use `get_last_value()`.",
                stacklevel=2,
            )
        value = self._get_closed_form()
        return [
            value if self._should_apply_to_param_group(g) else None
            for g in self.optimizer.param_groups
        ]

    def increment_last_epoch(self):
        """Adds 1 to ``last_epoch`` (in place once it is a tensor); with dynamic loss scaling,
        a step whose update was skipped does not count."""
        if isinstance(self.last_epoch, torch.Tensor):
            self.last_epoch.add_(self.optimizer._finite_increment())
        else:
            self.last_epoch += 1

    def step(self, *args, **kwargs):
        """Advances ``last_epoch`` and writes the new value into the param groups."""
        impl = current_backend_impl(raise_exception=False)
        if impl is not None and not impl.is_tracing:
            impl.materialize_state()  # an eager step must start from the newest state
        self.increment_last_epoch()
        self._step_count += 1
        if self._step_count == 1:
            return  # the implicit step of the constructor computes nothing
        self.update_last_value()

    def update_last_value(self):
        """Computes the value at ``last_epoch`` and writes it into the param groups."""
        with _GetWithinStep(self):
            values = self.get()
        self.update_groups(values)

    def update_groups(self, values):
        """Writes ``values`` (one per param group, None to skip) into the param groups."""
        for group, value in zip(self.optimizer.param_groups, values):
            if value is not None:
                _write_group_value(group, self.param_group_key, value)

    def get_last_value(self):
        """The current value of each targeted group (None for the others). Outside a traced
        step these are copies brought up to date with the device."""
        impl = current_backend_impl()
        key = self.param_group_key
        if impl.is_tracing:
            return [
                g[key] if self._should_apply_to_param_group(g) else None
                for g in self.optimizer.param_groups
            ]
        impl.materialize_state()
        self._last_value = [
            _copy_value(g[key]) if self._should_apply_to_param_group(g) else None
            for g in self.optimizer.param_groups
        ]
        return self._last_value

    # ------------------------------------------------------------------------- state
    def _cstorch_state_slots(self):
        return (
            [Slot(self.__dict__, "last_epoch")] if isinstance(self.last_epoch, torch.Tensor) else []
        )

    def state_dict(self):
        """Every attribute except ``optimizer`` and ``device`` (torch scheduler format)."""
        self.get_last_value()
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "device")}

    def load_state_dict(self, state_dict):
        """Restores attributes (``_step_count`` excepted) and re-registers with the backend."""
        state_dict = {k: plain_copies(v) for k, v in state_dict.items() if k != "_step_count"}
        self.__dict__.update(state_dict)
        self._validate_tags_apply()
        current_backend_impl().setup_scheduler(self)


def _copy_value(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _write_group_value(group, key, value):
    """Writes a scheduled value (as a float32 0-dim tensor) into a param group, in place when
    the group already holds such a tensor (a traced step then records a state update)."""
    value = torch.as_tensor(value).to(torch.float32)
    current = group.get(key)
    if (
        isinstance(current, torch.Tensor)
        and current.shape == value.shape
        and current.dtype == value.dtype
    ):
        with torch.no_grad():
            current.copy_(value)
        return
    impl = current_backend_impl(raise_exception=False)
    if impl is not None and impl.is_tracing:
        raise CstorchRuntimeError(
            f"A scheduler tried to write param group {key!r} inside a traced step, but the "
            f"group holds {current!r} instead of a float32 0-dim tensor, so the value could "
            "not persist between steps. Construct the scheduler (or call its "
            "update_last_value()) after loading the optimizer's state_dict and before the "
            "first traced step."
        )
    group[key] = value.detach().clone()


def _alias(name):
    """A property storing a base-class attribute under its LR-specific name."""
    return property(
        lambda self: getattr(self, name), lambda self, value: setattr(self, name, value)
    )


def inherit_docs(module_globals, base):
    """Gives each class without a docstring the docstring of its generic scheduler."""
    for cls in list(module_globals.values()):
        if isinstance(cls, type) and issubclass(cls, base) and cls.__doc__ is None:
            generic = next(
                (b for b in cls.__mro__[1:] if b.__module__ == __name__ and b is not Scheduler),
                None,
            )
            if generic is not None:
                cls.__doc__ = generic.__doc__


# ------------------------------------------------------------------------ built-in schedules
class ConstantScheduler(Scheduler):
    """``jax_backend.schedules.constant`` of ``val``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        val: float,
        total_iters: Optional[int] = None,
        param_group_tags: Tags = None,
    ):
        self.val = val
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)


class PolynomialScheduler(Scheduler):
    """``jax_backend.schedules.polynomial`` from ``initial_val`` to ``end_val``.

    With ``cycle=True`` the decay restarts every ``total_iters`` steps over a growing horizon
    (TF/Keras ``PolynomialDecay(cycle=True)``). Differs from cerebras-pytorch 2.10, where
    ``cycle`` has no effect (its clamp to ``end_val`` wins).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float,
        end_val: float,
        total_iters: int,
        power: float = 1.0,
        cycle: bool = False,
        param_group_tags: Tags = None,
    ):
        self.initial_val = initial_val
        self.end_val = end_val
        self.power = power
        self.cycle = cycle
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)


class LinearScheduler(PolynomialScheduler):
    """``PolynomialScheduler`` with ``power=1`` (``jax_backend.schedules.linear``)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float,
        end_val: float,
        total_iters: int,
        cycle: bool = False,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val,
            end_val,
            total_iters,
            power=1.0,
            cycle=cycle,
            param_group_tags=param_group_tags,
        )


class ExponentialScheduler(Scheduler):
    """``jax_backend.schedules.exponential`` from ``initial_val``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float,
        total_iters: int,
        decay_rate: float,
        staircase: bool = False,
        param_group_tags: Tags = None,
    ):
        self.initial_val = float(initial_val)
        self.decay_rate = decay_rate
        self.staircase = staircase
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)


class InverseExponentialTimeDecayScheduler(Scheduler):
    """``jax_backend.schedules.inverse_exponential_time_decay`` from ``initial_val`` (Keras
    ``InverseTimeDecay``)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float,
        step_exponent: int,
        total_iters: int,
        decay_rate: float,
        staircase: bool = False,
        param_group_tags: Tags = None,
    ):
        self.initial_val = initial_val
        self.step_exponent = step_exponent
        self.decay_rate = decay_rate
        self.staircase = staircase
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)


class InverseSquareRootDecayScheduler(Scheduler):
    """``jax_backend.schedules.inverse_square_root_decay`` of ``initial_val``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float = 1.0,
        scale: float = 1.0,
        warmup_steps: int = 1.0,
        param_group_tags: Tags = None,
    ):
        self.initial_val = initial_val
        self.scale = scale
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)


class CosineDecayScheduler(Scheduler):
    """``jax_backend.schedules.cosine_decay`` from ``initial_val`` to ``end_val``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float,
        end_val: float,
        total_iters: int,
        param_group_tags: Tags = None,
    ):
        self.initial_val = initial_val
        self.end_val = end_val
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)


class _ComposedScheduler(Scheduler):
    """A scheduler built from child schedulers (``self._schedulers``): their states nest
    under ``"_schedulers"`` in its state dict."""

    def _adopt(self, child):
        """Re-links a child after it was loaded from a state dict."""

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
            self._adopt(child)
            self.optimizer._schedulers_registry.pop(child, None)


class SequentialScheduler(_ComposedScheduler):
    """``schedulers[k]`` runs from ``milestones[k-1]`` to ``milestones[k]``, its own count
    restarting at 0 when it becomes active.

    Every child must drive the same optimizer and ``param_group_key`` with the same tags; there
    must be one milestone fewer than schedulers. The children leave the optimizer's scheduler
    registry (this scheduler steps them).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        schedulers: List[Scheduler],
        milestones: List[int],
        last_epoch: int = -1,
        param_group_tags: Tags = None,
    ):
        if isinstance(milestones, numpy.ndarray):
            milestones = milestones.tolist()
        if not isinstance(milestones, (list, tuple)):
            raise CstorchTypeError(
                f"Expected milestones to be a list of integers. Got: {type(milestones)}"
            )
        if any(not isinstance(m, int) or isinstance(m, bool) for m in milestones):
            raise CstorchTypeError(
                f"Expected milestones to be a list of integers. Got: "
                f"{list(milestones)!r} (types {[type(m) for m in milestones]})"
            )
        schedulers = list(schedulers)
        for index, scheduler in enumerate(schedulers):
            if scheduler.optimizer is not optimizer:
                raise CstorchValueError(
                    f"Sequential Schedulers expects all schedulers to belong to the same "
                    f"optimizer, but got schedulers at index {index} to be different than the "
                    f"optimizer passed in."
                )
            if scheduler.param_group_key != self.param_group_key:
                raise CstorchValueError(
                    f"Sequential Schedulers expects all schedulers to have the same "
                    f"`param_group_key`, but got {scheduler.param_group_key!r} at index "
                    f"{index} instead of {self.param_group_key!r}."
                )
        if len(milestones) != len(schedulers) - 1:
            raise CstorchValueError(
                f"Sequential Schedulers expects number of schedulers provided to be one more "
                f"than the number of milestone points, but got number of schedulers "
                f"{len(schedulers)} and the number of milestones to be equal to "
                f"{len(milestones)}"
            )
        self._schedulers = schedulers
        self._milestones = list(milestones)
        for scheduler in schedulers:
            optimizer._schedulers_registry.pop(scheduler, None)
        super().__init__(
            optimizer, total_iters=None, last_epoch=last_epoch, param_group_tags=param_group_tags
        )

    def _post_init(self):
        for index, scheduler in enumerate(self._schedulers):
            if scheduler.param_group_tags != self.param_group_tags:
                raise CstorchValueError(
                    f"Sequential Schedulers expects all schedulers to have the same "
                    f"`param_group_tags`, but found {scheduler.param_group_tags} at index "
                    f"{index} instead of {self.param_group_tags}."
                )
        super()._post_init()

    def _schedule_config(self):
        children = [s._pure_config() for s in self._schedulers]
        if any(c is None for c in children):
            return None
        return {"kind": "sequential", "schedules": children, "milestones": self._milestones}

    def _get_closed_form(self):
        if self._schedule_config() is not None:
            return super()._get_closed_form()
        value = self._schedulers[0]._get_closed_form()
        for index, milestone in enumerate(self._milestones):
            value = torch.where(
                self.last_epoch < milestone, value, self._schedulers[index + 1]._get_closed_form()
            )
        return value

    def increment_last_epoch(self):
        super().increment_last_epoch()
        if self._step_count == 0:
            return  # the children took their own initial step when they were built
        self._schedulers[0].increment_last_epoch()
        for index, milestone in enumerate(self._milestones):
            child = self._schedulers[index + 1]
            active = torch.where(self.last_epoch <= milestone, 0, 1)
            child.last_epoch.add_(active * self.optimizer._finite_increment())


class PiecewiseConstantScheduler(SequentialScheduler):
    """``vals[k]`` on ``[milestones[k-1], milestones[k])`` and ``vals[-1]`` after the last
    milestone: a ``SequentialScheduler`` of ``constant_cls`` children.

    Pass ``len(milestones) + 1`` values (``len(milestones)`` also works: the last one then
    holds from the last milestone on, as in cerebras-pytorch). More values than that raise
    ValueError (the reference ignored the extra ones).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        constant_cls: type,
        vals: List[float],
        milestones: List[int],
        param_group_tags: Tags = None,
    ):
        vals = list(vals)
        if isinstance(milestones, numpy.ndarray):
            milestones = milestones.tolist()
        if len(vals) > len(milestones) + 1 or not vals:
            raise CstorchValueError(
                f"{type(self).__name__} needs len(milestones) + 1 values, got "
                f"{len(vals)} values {vals} for milestones {list(milestones)}."
            )
        boundaries = [0] + list(milestones)
        schedulers = [
            constant_cls(optimizer, val, end - start, param_group_tags=param_group_tags)
            for val, start, end in zip(vals, boundaries[:-1], boundaries[1:])
        ]
        schedulers.append(constant_cls(optimizer, vals[-1], param_group_tags=param_group_tags))
        super().__init__(optimizer, schedulers, milestones, param_group_tags=param_group_tags)


class MultiStepScheduler(Scheduler):
    """``jax_backend.schedules.multi_step`` from ``initial_val``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float,
        gamma: float,
        milestones: List[int],
        param_group_tags: Tags = None,
    ):
        self.initial_val = initial_val
        self.gamma = gamma
        self.milestones = milestones
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)


class StepScheduler(Scheduler):
    """``jax_backend.schedules.step`` from ``initial_val``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float,
        step_size: int,
        gamma: float,
        param_group_tags: Tags = None,
    ):
        self.initial_val = float(initial_val)
        self.gamma = gamma
        self.step_size = step_size
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)


class CosineAnnealingScheduler(Scheduler):
    """``jax_backend.schedules.cosine_annealing`` from ``initial_val`` (periodic: no clamp at
    ``T_max``, no restarts)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float,
        T_max: int,
        eta_min: float = 0.0,
        param_group_tags: Tags = None,
    ):
        self.initial_val = float(initial_val)
        self.T_max = float(T_max)
        self.eta_min = eta_min
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)


def _default_lambda_epoch_div_30(epoch):
    return torch.div(epoch, 30)


def _default_lambda_pow_095(epoch):
    return torch.pow(torch.tensor(0.95, dtype=torch.float32), epoch)


_DEFAULT_LAMBDAS = (_default_lambda_epoch_div_30, _default_lambda_pow_095)


class LambdaScheduler(Scheduler):
    """``initial_val·Π_i f_i(t)`` for the functions ``set_value_lambda()`` returns.

    Override ``set_value_lambda`` (in a subclass) to return a list of functions of the
    ``last_epoch`` tensor written in torch ops (the schedule is then captured as torch code),
    or a list of names registered with ``jax_backend.schedules.register_lambda`` (the schedule
    is then a JAX function, also usable as ``schedule_fn``). The default functions are
    ``t/30`` and ``0.95^t``.

    Differs from cerebras-pytorch 2.10, which multiplies ``initial_val`` in once per function
    (so its default gives ``initial_val²·(t/30)·0.95^t``): here ``initial_val`` is applied once.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, initial_val: float, param_group_tags: Tags = None
    ):
        self.initial_val = initial_val
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def set_value_lambda(self):
        """The factor functions (see class docstring)."""
        return list(_DEFAULT_LAMBDAS)

    def _lambdas(self):
        fns = self.set_value_lambda()
        return list(fns) if isinstance(fns, (list, tuple)) else [fns]

    def _schedule_config(self):
        if type(self).set_value_lambda is LambdaScheduler.set_value_lambda:
            return {"kind": "lambda", "initial": _number(self.initial_val), "fn": "default"}
        fns = self._lambdas()
        if fns and all(isinstance(f, str) for f in fns):
            return {"kind": "lambda", "initial": _number(self.initial_val), "fn": fns}
        return None

    def _get_closed_form(self):
        if self._schedule_config() is not None:
            return super()._get_closed_form()
        value = torch.tensor(self.initial_val, dtype=torch.float32)
        for fn in self._lambdas():
            if isinstance(fn, str):
                raise CstorchTypeError(
                    f"{type(self).__name__}.set_value_lambda mixes names and functions "
                    f"({self._lambdas()!r}); return only names or only torch functions."
                )
            value = torch.mul(value, fn(self.last_epoch))
        return value


class CosineAnnealingWarmRestartsScheduler(Scheduler):
    """SGDR with ``T_mult = 1``:
    ``eta_min + (initial_val-eta_min)·(1 + cos(π·(t mod T_0)/T_0))/2``.

    ``T_mult != 1`` raises ValueError, as in cerebras-pytorch 2.10. Differs from
    cerebras-pytorch 2.10 after the first period: it computes ``T_cur = (floor(t/T_0) - 1)·T_0``
    there, so its
    values become piecewise constant (``initial_val`` on ``[T_0, 2T_0)``, ``eta_min`` on
    ``[2T_0, 3T_0)``, ...); here every period restarts the cosine, as SGDR and torch do.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float,
        T_0: int,
        T_mult: int = 1,
        eta_min: float = 0.0,
        param_group_tags: Tags = None,
    ):
        if T_mult != 1.0:
            raise CstorchValueError(
                f"Unsupported value of Parameters 'T_mult' for LR scheduler type "
                f"CosineAnnealingWarmRestarts: got T_mult={T_mult!r}, only T_mult=1 is "
                "supported."
            )
        self.initial_val = float(initial_val)
        self.T_0 = T_0
        self.T_mult = T_mult
        self.eta_min = eta_min
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)


class MultiplicativeScheduler(Scheduler):
    """``initial_val·coefficient^t``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float,
        coefficient: float,
        param_group_tags: Tags = None,
    ):
        self.initial_val = initial_val
        self.coefficient = coefficient
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def set_value_lambda(self):
        """The per-step factor as a function of the step (a subclass may override it with a
        torch function of ``last_epoch``)."""
        return lambda epoch: self.coefficient

    def _schedule_config(self):
        if type(self).set_value_lambda is not MultiplicativeScheduler.set_value_lambda:
            return None
        return {
            "kind": "multiplicative",
            "initial": _number(self.initial_val),
            "coefficient": _number(self.coefficient),
        }

    def _get_closed_form(self):
        if self._schedule_config() is not None:
            return super()._get_closed_form()
        factor = torch.as_tensor(self.set_value_lambda()(self.last_epoch), dtype=torch.float32)
        return torch.mul(torch.pow(factor, self.last_epoch), self.initial_val)


class ChainedScheduler(_ComposedScheduler):
    """The product ``s_0(t)·Π_{i>=1} s_i(t)/s_i.initial_val`` of its children, which share
    this scheduler's ``last_epoch``. It takes no optimizer: the children's is used; they must
    all drive it with this scheduler's tags, and every child after the first needs an
    ``initial_val``.
    """

    def __init__(self, schedulers: List[Scheduler], param_group_tags: Tags = None):
        self._schedulers = list(schedulers)
        if not self._schedulers:
            raise CstorchValueError("ChainedScheduler needs at least one scheduler, got none.")
        for index, scheduler in enumerate(self._schedulers[1:], start=1):
            if not hasattr(scheduler, "initial_val"):
                raise CstorchTypeError(
                    f"ChainedScheduler divides by the initial value of every scheduler after "
                    f"the first, but {type(scheduler).__name__} at index {index} has no "
                    "`initial_val`; put it first in the chain or use another scheduler."
                )
        super().__init__(
            self._schedulers[0].optimizer, total_iters=None, param_group_tags=param_group_tags
        )

    def _post_init(self):
        for index, scheduler in enumerate(self._schedulers):
            if scheduler.optimizer is not self.optimizer:
                raise CstorchValueError(
                    f"ChainedScheduler expects all schedulers to belong to the same optimizer, "
                    f"but got schedulers at index 0 and {index} to be different"
                )
            if scheduler.param_group_tags != self.param_group_tags:
                raise CstorchValueError(
                    f"Chained Scheduler expects all schedulers to have the same "
                    f"`param_group_tags`, but found {scheduler.param_group_tags} at index "
                    f"{index} instead of {self.param_group_tags}."
                )
            scheduler.last_epoch = self.last_epoch
            self.optimizer._schedulers_registry.pop(scheduler, None)
        super()._post_init()

    def _schedule_config(self):
        children = [s._pure_config() for s in self._schedulers]
        if any(c is None for c in children):
            return None
        return {
            "kind": "chained",
            "schedules": children,
            "initials": [_number(s.initial_val) for s in self._schedulers[1:]],
        }

    def _get_closed_form(self):
        if self._schedule_config() is not None:
            return super()._get_closed_form()
        value = self._schedulers[0]._get_closed_form()
        for scheduler in self._schedulers[1:]:
            value = torch.mul(value, torch.div(scheduler._get_closed_form(), scheduler.initial_val))
        return value

    def _adopt(self, child):
        child.last_epoch = self.last_epoch  # the children count with the chain's counter


class CyclicScheduler(Scheduler):
    """Cyclical values (CLR) between ``base_val`` and ``max_val``: up in ``step_size_up``
    steps, down in ``step_size_down`` (default: ``step_size_up``).

    ``mode`` is "triangular", "triangular2" (amplitude halved each cycle) or anything else for
    "exp_range" (amplitude times ``gamma^t``). ``scale_mode`` is set by the mode ("cycle" for
    the triangular modes, "iterations" otherwise), as in cerebras-pytorch.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        base_val: float,
        max_val: float,
        step_size_up: int = 2000,
        step_size_down: int = None,
        mode: str = "triangular",
        gamma: float = 1.0,
        scale_mode: str = "cycle",
        param_group_tags: Tags = None,
    ):
        self.base_val = base_val
        self.max_val = max_val
        self.step_size_up = step_size_up
        self.step_size_down = step_size_up if step_size_down is None else step_size_down
        self.mode = mode
        self.gamma = gamma
        self.scale_mode = "cycle" if mode in ("triangular", "triangular2") else "iterations"
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)


class OneCycleScheduler(Scheduler):
    """The 1cycle policy: ``initial_val -> max_val`` until step ``pct_start·total_steps - 1``,
    then down to ``initial_val/final_div_factor`` at ``total_steps - 1`` (with
    ``three_phase``: back to ``initial_val`` at ``2·pct_start·total_steps - 2`` first).
    ``anneal_strategy`` "cos" anneals by cosine, anything else linearly."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_val: float,
        max_val: float,
        total_steps: int = 1000,
        pct_start: float = 0.3,
        final_div_factor: float = 10000.0,
        three_phase: bool = False,
        anneal_strategy: str = "cos",
        param_group_tags: Tags = None,
    ):
        self.initial_val = initial_val
        self.max_val = max_val
        self.total_steps = total_steps
        self.pct_start = pct_start
        self.final_div_factor = final_div_factor
        self.three_phase = three_phase
        self.anneal_strategy = anneal_strategy
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)


class ScalePerParamScheduler(Scheduler):
    """The wrapped scheduler's value times a per-group factor: the group's
    ``adjust_learning_rate``, else its ``adjust_val``, else 1 (read at construction).

    The wrapped scheduler must have the same tags and leaves the optimizer's registry; its
    state_dict is nested under ``"_scheduler"``. ``schedule_fn`` is the wrapped (unscaled)
    schedule; group ``i`` gets ``jax_backend.schedules.scaled(schedule_fn,
    adjustment_scalars[i])``. Do not wrap a chained scheduler.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, scheduler: Scheduler, param_group_tags: Tags = None
    ):
        self.adjustment_scalars = [
            group.get("adjust_learning_rate", group.get("adjust_val", 1.0))
            for group in optimizer.param_groups
        ]
        self._scheduler_nested = scheduler
        optimizer._schedulers_registry.pop(scheduler, None)
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _post_init(self):
        if self._scheduler_nested.param_group_tags != self.param_group_tags:
            raise CstorchValueError(
                f"ScalePerParamScheduler expects the wrapped scheduler to have the same "
                f"`param_group_tags`, but found {self._scheduler_nested.param_group_tags} "
                f"instead of {self.param_group_tags}."
            )
        super()._post_init()

    def _schedule_config(self):
        return self._scheduler_nested._pure_config()

    def _get_closed_form(self):
        return self._scheduler_nested._get_closed_form()

    def get(self):
        if not self._get_called_within_step:
            warnings.warn(
                "To get the last value computed by the scheduler, please use `get_last_value()`.",
                stacklevel=2,
            )
        value = self._get_closed_form()
        return [
            value * self.adjustment_scalars[index]
            if self._should_apply_to_param_group(group)
            else None
            for index, group in enumerate(self.optimizer.param_groups)
        ]

    def increment_last_epoch(self):
        super().increment_last_epoch()
        if self._step_count == 0:
            return
        self._scheduler_nested.increment_last_epoch()

    def state_dict(self):
        state = super().state_dict()
        state.pop("_scheduler_nested", None)
        state["_scheduler"] = self._scheduler_nested.state_dict()
        state["_scheduler"].pop("_get_called_within_step", None)
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        nested = state_dict.pop("_scheduler")
        super().load_state_dict(state_dict)
        self._scheduler_nested.load_state_dict(nested)
        self.optimizer._schedulers_registry.pop(self._scheduler_nested, None)


# --------------------------------------------------------------------- schedules as data
def _as_is(value):
    return value


def _as_list(value):
    return value.tolist() if isinstance(value, numpy.ndarray) else list(value)


# Each built-in scheduler computes one pure schedule, ``jax_backend.schedules.<kind>``, whose
# docstring holds the formula. A row maps the schedule's arguments to the attributes that
# feed them (converted to JSON numbers unless a converter is given); subclasses (LinearLR,
# the LR and weight-decay aliases) inherit their base's row.
_SCHEDULE_TABLE = {
    ConstantScheduler: ("constant", {"value": "val"}),
    PolynomialScheduler: (
        "polynomial",
        {
            "initial": "initial_val",
            "end": "end_val",
            "total_iters": "total_iters",
            "power": "power",
            "cycle": ("cycle", bool),
        },
    ),
    ExponentialScheduler: (
        "exponential",
        {
            "initial": "initial_val",
            "total_iters": "total_iters",
            "decay_rate": "decay_rate",
            "staircase": ("staircase", bool),
        },
    ),
    InverseExponentialTimeDecayScheduler: (
        "inverse_exponential_time_decay",
        {
            "initial": "initial_val",
            "step_exponent": "step_exponent",
            "total_iters": "total_iters",
            "decay_rate": "decay_rate",
            "staircase": ("staircase", bool),
        },
    ),
    InverseSquareRootDecayScheduler: (
        "inverse_square_root_decay",
        {"initial": "initial_val", "scale": "scale", "warmup_steps": "warmup_steps"},
    ),
    CosineDecayScheduler: (
        "cosine_decay",
        {"initial": "initial_val", "end": "end_val", "total_iters": "total_iters"},
    ),
    MultiStepScheduler: (
        "multi_step",
        {"initial": "initial_val", "gamma": "gamma", "milestones": ("milestones", _as_list)},
    ),
    StepScheduler: ("step", {"initial": "initial_val", "step_size": "step_size", "gamma": "gamma"}),
    CosineAnnealingScheduler: (
        "cosine_annealing",
        {"initial": "initial_val", "T_max": "T_max", "eta_min": "eta_min"},
    ),
    CosineAnnealingWarmRestartsScheduler: (
        "cosine_annealing_warm_restarts",
        {"initial": "initial_val", "T_0": "T_0", "T_mult": "T_mult", "eta_min": "eta_min"},
    ),
    CyclicScheduler: (
        "cyclic",
        {
            "base": "base_val",
            "max_value": "max_val",
            "step_size_up": "step_size_up",
            "step_size_down": "step_size_down",
            "mode": ("mode", _as_is),
            "gamma": "gamma",
            "scale_mode": ("scale_mode", _as_is),
        },
    ),
    OneCycleScheduler: (
        "one_cycle",
        {
            "initial": "initial_val",
            "max_value": "max_val",
            "total_steps": "total_steps",
            "pct_start": "pct_start",
            "final_div_factor": "final_div_factor",
            "three_phase": ("three_phase", bool),
            "anneal_strategy": ("anneal_strategy", _as_is),
        },
    ),
}


__all__ = ["Scheduler"] + [
    name
    for name, value in list(globals().items())
    if isinstance(value, type)
    and issubclass(value, Scheduler)
    and value is not Scheduler
    and value.__module__ == __name__
    and not name.startswith("_")
]
