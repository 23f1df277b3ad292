"""Building optimizers and schedulers from configuration dicts (the cstorch 1.x helpers).

cerebras-pytorch 2.10 no longer ships these; they follow the contract of the earlier releases:
names are matched against the ``Optimizer`` / ``Scheduler`` subclasses (user
subclasses included), the class signature decides which config keys are used, and keys that
were renamed raise ``ValueError`` naming the parameter to use instead.

Example (a warm-up then a decay, i.e. ``SequentialLR`` with milestones ``[100]``)::

    configure_lr_scheduler(optimizer, [
        {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 0.1,
         "total_iters": 100},
        {"scheduler": "CosineDecay", "initial_learning_rate": 0.1, "end_learning_rate": 0.0,
         "total_iters": 900}])
"""

from __future__ import annotations

import copy
import inspect
import logging
from itertools import accumulate

from cstorch.errors import quoted
from cstorch.optim import lr_scheduler, scheduler
from cstorch.optim.optimizer import BuiltinOptimizer, Optimizer
from jax_backend.errors import CstorchRuntimeError, CstorchValueError

logger = logging.getLogger(__name__)

# Old config names of optimizer parameters; any one of them present is an error.
_OPTIMIZER_ALIASES = {
    "weight_decay": ("weight_decay_rate",),
    "betas": ("beta1", "beta2"),
    "eps": ("eps1", "eps2"),
    "etas": ("eta1", "eta2"),
    "step_sizes": ("step_size_min", "step_size_max"),
}
# Old config names of scheduler parameters.
_SCHEDULER_ALIASES = {
    "total_iters": ("steps", "decay_steps"),
    "initial_learning_rate": ("learning_rate", "base_lr"),
    "base_lr": ("learning_rate", "initial_learning_rate"),
    "learning_rates": ("values",),
    "milestones": ("boundaries",),
}


def _subclasses(cls) -> list:
    """Every subclass of ``cls``, recursively, without duplicates (definition order)."""
    found, pending = [], list(cls.__subclasses__())
    while pending:
        sub = pending.pop(0)
        if sub not in found:
            found.append(sub)
            pending.extend(sub.__subclasses__())
    return found


def _optimizer_classes() -> dict:
    return {
        c.__name__.lower(): c
        for c in _subclasses(Optimizer)
        if c is not BuiltinOptimizer and not c.__name__.startswith("_")
    }


def _deprecation_error(cls, found) -> ValueError:
    lines = "".join(f"\n\texpected: {expected}, actual: {actual}" for expected, actual in found)
    return ValueError(
        f"{cls.__name__} got the following parameters which are no longer supported. Please "
        f"update your configs to use the new parameters instead.{lines}"
    )


def _signature_with_values(cls, signature, first, values):
    """The signature with the values the user passed as defaults (for error messages; the
    type annotations are left out to keep it short)."""
    params = []
    for name, param in list(signature.parameters.items())[1:]:
        if name in values:
            default = values[name]
        elif param.default is not inspect.Parameter.empty or name == first:
            default = param.default
        else:
            default = "<missing>"
        params.append(param.replace(default=default, annotation=inspect.Parameter.empty))
    return f"{cls.__name__}{signature.replace(parameters=params)}"


def configure_optimizer_params(optimizer_type: str, kwargs: dict):
    """``(cls, cls_kwargs)`` for the optimizer named ``optimizer_type`` (case-insensitive).

    ``learning_rate`` (a float or numeric string) feeds ``lr``; without it the class default is
    used, or 0.1 where ``lr`` is required (a scheduler will set it). Only parameters of the
    class signature are kept: others are logged as unused. Old names (``weight_decay_rate``,
    ``beta1``/``beta2``, ``eps1``/``eps2``, ``eta1``/``eta2``,
    ``step_size_min``/``step_size_max``) raise ``ValueError``.
    """
    classes = _optimizer_classes()
    if not isinstance(optimizer_type, str) or optimizer_type.lower() not in classes:
        raise CstorchValueError(
            f"Invalid optimizer type. Expected one of {sorted(classes)}. Got: "
            f"{quoted(optimizer_type)}"
        )
    cls = classes[optimizer_type.lower()]
    kwargs = dict(kwargs)
    learning_rate = kwargs.pop("learning_rate", None)
    learning_rate = (
        float(learning_rate)
        if isinstance(learning_rate, (float, int, str)) and not isinstance(learning_rate, bool)
        else None
    )

    signature = inspect.signature(cls.__init__)
    names = list(signature.parameters)
    if len(names) < 2 or names[1] != "params":
        raise CstorchValueError(
            f'To use "cstorch.optim.configure_optimizer()", the optimizer class must accept '
            f'"params" as its first argument, but its signature is {cls.__name__}{signature}'
        )
    cls_kwargs, deprecated = {}, []
    for name, param in list(signature.parameters.items())[2:]:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            cls_kwargs.update(kwargs)
            kwargs = {}
            break
        if name in kwargs:
            cls_kwargs[name] = kwargs.pop(name)
        elif name in ("lr", "learning_rate"):
            if learning_rate is None:
                learning_rate = 0.1 if param.default is inspect.Parameter.empty else param.default
            cls_kwargs[name] = learning_rate
        elif name in _OPTIMIZER_ALIASES:
            old = next((a for a in _OPTIMIZER_ALIASES[name] if a in kwargs), None)
            if old is not None:
                deprecated.append((name, old))
    if deprecated:
        raise _deprecation_error(cls, deprecated)
    if kwargs:
        logger.warning(
            "%s got %d unexpected and unused parameters: %s.\nPlease ensure that you specified "
            "the correct parameters:\n%s",
            cls.__name__,
            len(kwargs),
            sorted(kwargs),
            _signature_with_values(cls, signature, "params", cls_kwargs),
        )
    return cls, cls_kwargs


def configure_optimizer(optimizer_type: str, params, **kwargs):
    """Builds the optimizer named ``optimizer_type`` (see ``configure_optimizer_params``)."""
    cls, cls_kwargs = configure_optimizer_params(optimizer_type, kwargs)
    try:
        return cls(params, **cls_kwargs)
    except TypeError as error:
        raise CstorchRuntimeError(
            f"Failed to configure {cls.__name__} optimizer: {error}"
        ) from error


def configure_scheduler_params(learning_rate: dict):
    """``(cls, cls_kwargs)`` for one learning-rate scheduler config.

    ``learning_rate["scheduler"]`` names an ``LRScheduler`` subclass, case-insensitively and
    with or without its ``LR`` suffix ("linear" -> ``LinearLR``). Unknown keys raise
    ``ValueError`` showing the signature; old names (a lower-cased parameter name such as
    ``t_max``, ``steps``/``decay_steps`` for ``total_iters``, ``learning_rate``/``base_lr`` for
    ``initial_learning_rate``, ``values`` for ``learning_rates``, ``boundaries`` for
    ``milestones``) raise ``ValueError`` naming the parameter to use.
    """
    if not isinstance(learning_rate, dict):
        raise CstorchValueError(f"A scheduler config must be a dict, got {quoted(learning_rate)}")
    params = dict(learning_rate)
    classes = {c.__name__.lower(): c for c in _subclasses(lr_scheduler.LRScheduler)}
    if "scheduler" not in params:
        raise CstorchValueError(
            f"A learning-rate scheduler config needs a 'scheduler' key naming one "
            f"of {sorted(classes)}; got keys {quoted(sorted(params))}"
        )
    name = str(params.pop("scheduler")).lower()
    cls = classes.get(name) or classes.get(f"{name}lr")
    if cls is None:
        raise CstorchValueError(
            f"Invalid lr_scheduler type. Expected one of {sorted(classes)}. Got: {quoted(name)}"
        )
    signature = inspect.signature(cls.__init__)
    names = list(signature.parameters)
    if len(names) < 2 or names[1] != "optimizer":
        raise CstorchValueError(
            f'To use "cstorch.optim.configure_lr_scheduler()", the scheduler class must accept '
            f'"optimizer" as its first argument, but its signature is {cls.__name__}{signature}'
        )
    cls_kwargs, deprecated, any_kwargs = {}, [], False
    for pname, param in list(signature.parameters.items())[2:]:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            cls_kwargs.update(params)
            params, any_kwargs = {}, True
            break
        if pname in params:
            cls_kwargs[pname] = params.pop(pname)
        elif pname.lower() in params:
            deprecated.append((pname, pname.lower()))
        elif pname in _SCHEDULER_ALIASES:
            old = next((a for a in _SCHEDULER_ALIASES[pname] if a in params), None)
            if old is not None:
                deprecated.append((pname, old))
    if deprecated:
        raise _deprecation_error(cls, deprecated)
    if params and not any_kwargs:
        raise CstorchValueError(
            f"{cls.__name__} got {len(params)} unexpected parameters: "
            f"{quoted(sorted(params))}.\n"
            f"Please ensure that you specified the correct parameters:\n"
            f"{_signature_with_values(cls, signature, 'optimizer', cls_kwargs)}\n"
        )
    return cls, cls_kwargs


def _build_lr_scheduler(optimizer, config: dict):
    cls, cls_kwargs = configure_scheduler_params(config)
    try:
        return cls(optimizer, **cls_kwargs)
    except TypeError as error:
        raise CstorchRuntimeError(
            f"Failed to configure {cls.__name__} scheduler: {error}"
        ) from error


def _cumulative_milestones(schedulers) -> list:
    for child in schedulers[:-1]:
        if child.total_iters is None:
            raise CstorchValueError(
                f"To run schedulers one after another, every scheduler but the last needs "
                f"`total_iters` (it places the milestones), but {type(child).__name__} has "
                "none. Give it total_iters, or build a SequentialLR with explicit milestones."
            )
    return list(accumulate(int(child.total_iters) for child in schedulers[:-1]))


def configure_lr_scheduler(optimizer, learning_rate, adjust_learning_rate=None):
    """Builds a learning-rate scheduler from a config.

    ``learning_rate`` is: falsy (returns None); a float or numeric string (``ConstantLR``); a
    dict (one scheduler, see ``configure_scheduler_params``); or a list of dicts (a
    ``SequentialLR`` whose milestones are the running sums of ``total_iters``, or a
    ``ChainedScheduler`` when an entry sets ``main_scheduler: "chained"``). A truthy
    ``adjust_learning_rate`` wraps the result in ``ScalePerParamLR`` (which reads each group's
    ``adjust_learning_rate`` factor); that cannot be combined with chaining.
    """
    if not learning_rate:
        return None
    learning_rate = copy.deepcopy(learning_rate)
    if isinstance(learning_rate, (float, int, str)) and not isinstance(learning_rate, bool):
        configs = [{"scheduler": "constant", "learning_rate": float(learning_rate)}]
    elif isinstance(learning_rate, dict):
        configs = [learning_rate]
    elif isinstance(learning_rate, (list, tuple)):
        configs = list(learning_rate)
    else:
        raise CstorchValueError(
            f"Unsupported LR scheduler type. Expected one of "
            f"float/str/dict/list/tuple. Got: {quoted(learning_rate)}"
        )

    # Every entry is validated before any scheduler is built: building one reaches the
    # optimizer (and its backend), and a bad name must be reported as such, not as whatever
    # building an earlier entry ran into.
    entries, main = [], set()
    for config in configs:
        if not isinstance(config, dict):
            raise CstorchValueError(
                f"Each entry of a learning-rate schedule list must be a dict, got {quoted(config)}"
            )
        config = dict(config)
        chosen = config.pop("main_scheduler", None)
        if chosen:
            main.add(chosen)
        entries.append((config, configure_scheduler_params(config)))
    if len(main) > 1:
        raise CstorchValueError(
            f"Got conflicting `main_scheduler` values: {main}. Please make sure "
            "to specify the same main scheduler."
        )
    main = next(iter(main), None)
    chained = main is not None and main.lower() in ("chained", "chainedlr")
    if chained and adjust_learning_rate:
        raise CstorchValueError(
            f"{main} is not supported with lr scaling. Either use a non-chained scheduler "
            "or don't use lr scaling (don't pass `adjust_learning_rate`)."
        )

    schedulers = [_build_lr_scheduler(optimizer, config) for config, _ in entries]
    if chained:
        return lr_scheduler.ChainedScheduler(schedulers)
    if len(schedulers) == 1:
        result = schedulers[0]
    else:
        result = lr_scheduler.SequentialLR(
            optimizer, schedulers, _cumulative_milestones(schedulers)
        )
    if adjust_learning_rate:
        return lr_scheduler.ScalePerParamLR(optimizer, result)
    return result


def configure_scheduler(optimizer, schedulers_params: dict):
    """Builds any scheduler from ``{ExactClassName: kwargs}`` (the class is looked up among
    all ``Scheduler`` subclasses, case-sensitively).

    Sequential schedulers (except piecewise-constant ones) and chained schedulers take their
    children from ``kwargs["schedulers"]``, a list of such single-key dicts (sequential
    milestones default to the running sums of the children's ``total_iters``);
    scale-per-param schedulers take one child from ``kwargs["scheduler"]``. Children must not
    set ``param_group_tags``: they inherit the parent's.
    """
    classes = {c.__name__: c for c in _subclasses(scheduler.Scheduler)}
    _check_scheduler_names(schedulers_params, classes)  # all of them, before building any
    params = copy.deepcopy(schedulers_params)
    name, kwargs = next(iter(params.items()))
    kwargs = dict(kwargs or {})
    cls = classes[name]

    def children(configs):
        if isinstance(configs, dict):
            configs = [configs]
        tags = kwargs.get("param_group_tags")
        built = []
        for config in configs:
            if not isinstance(config, dict) or len(config) != 1:
                raise CstorchValueError(
                    f"A {name} sub-scheduler must be a dict with exactly one "
                    f"key, the scheduler class name, got {config!r}"
                )
            child_name, child_kwargs = next(iter(config.items()))
            child_kwargs = dict(child_kwargs or {})
            if "param_group_tags" in child_kwargs:
                raise CstorchValueError(
                    f"Parameter `param_group_tags` found in a non-main scheduler {child_name}. "
                    f"A {name} main-scheduler expects all sub-schedulers to have no "
                    "`param_group_tags`: set it on the main scheduler only."
                )
            if tags:
                child_kwargs["param_group_tags"] = tags
            built.append(configure_scheduler(optimizer, {child_name: child_kwargs}))
        return built

    if issubclass(cls, scheduler.SequentialScheduler) and not issubclass(
        cls, scheduler.PiecewiseConstantScheduler
    ):
        subs = children(_required(kwargs, "schedulers", name))
        milestones = kwargs.pop("milestones", None)
        if milestones is None:
            milestones = _cumulative_milestones(subs)
        return cls(optimizer, subs, milestones, **kwargs)
    if issubclass(cls, scheduler.ChainedScheduler):
        return cls(children(_required(kwargs, "schedulers", name)), **kwargs)
    if issubclass(cls, scheduler.ScalePerParamScheduler):
        subs = children(_required(kwargs, "scheduler", name))
        if len(subs) != 1:
            raise CstorchValueError(f"{name} must contain exactly 1 scheduler, got {len(subs)}.")
        return cls(optimizer, subs[0], **kwargs)
    return cls(optimizer, **kwargs)


def _check_scheduler_names(config, classes, parent="configure_scheduler") -> None:
    """Raises ``ValueError`` for a malformed entry or unknown class name anywhere in a
    ``configure_scheduler`` config (children included)."""
    if not isinstance(config, dict) or len(config) != 1:
        raise CstorchValueError(
            f"{parent} expects a dict with exactly one key, the scheduler class "
            f"name, got {config!r}"
        )
    name, kwargs = next(iter(config.items()))
    cls = classes.get(name)
    if cls is None:
        raise CstorchValueError(
            f"Invalid scheduler type. Expected one of {sorted(classes)}. Got: ({name})"
        )
    if not isinstance(kwargs, dict):
        return
    nested = (
        issubclass(cls, (scheduler.SequentialScheduler, scheduler.ChainedScheduler))
        and not issubclass(cls, scheduler.PiecewiseConstantScheduler)
    ) or issubclass(cls, scheduler.ScalePerParamScheduler)
    if not nested:
        return
    children = kwargs.get("scheduler", kwargs.get("schedulers", []))
    for child in [children] if isinstance(children, dict) else children or []:
        _check_scheduler_names(child, classes, parent=f"A {name} sub-scheduler")


def _required(kwargs, key, name):
    if key not in kwargs:
        raise CstorchValueError(f"{name} needs {key!r} in its config, got keys {sorted(kwargs)}")
    return kwargs.pop(key)


__all__ = [
    "configure_lr_scheduler",
    "configure_optimizer",
    "configure_optimizer_params",
    "configure_scheduler",
    "configure_scheduler_params",
]
