"""1.x optimizer and scheduler configs for ``cstorch.optim`` (``configure_optimizer``,
``configure_lr_scheduler``).

Model Zoo 1.x YAML names parameters the 1.x way (``weight_decay_rate``, ``beta1``/``beta2``,
``use_nesterov``, scheduler ``steps``/``decay_steps``, ...). 2.x's ``cstorch.optim`` refuses
those names with an error; the 1.8/1.9 API accepted them, so here they are translated to the
2.x parameter names first. Runner-only keys of the ``optimizer:`` section (loss scaling,
clipping, accumulation, summaries) are not optimizer arguments and are dropped.
"""

from __future__ import annotations

import copy
import inspect

from cstorch.optim import *  # noqa: F403 - the 1.8 namespace is cstorch.optim's
from cstorch.optim import Optimizer, config as _config, lr_scheduler  # noqa: F401

# Keys of a 1.x ``optimizer:`` section that the runner reads; never optimizer arguments.
RUNNER_KEYS = frozenset(
    {
        "optimizer_type",
        "loss_scaling_factor",
        "initial_loss_scale",
        "steps_per_increase",
        "min_loss_scale",
        "max_loss_scale",
        "max_gradient_norm",
        "max_gradient_value",
        "grad_accum_steps",
        "log_summaries",
        "disable_lr_steps_reset",
        "adjust_learning_rate",
        "loss_scale",
    }
)


def translate_optimizer_params(optimizer_type: str, params: dict) -> dict:
    """The 2.x keyword arguments of ``optimizer_type`` for a 1.x optimizer config."""
    cls, _ = _config.configure_optimizer_params(optimizer_type, {})
    accepted = set(inspect.signature(cls.__init__).parameters)
    out = {k: v for k, v in params.items() if k not in RUNNER_KEYS}
    if "weight_decay_rate" in out:
        value = out.pop("weight_decay_rate")
        if "weight_decay" in accepted:
            out.setdefault("weight_decay", value)
    if "beta1" in out or "beta2" in out:
        beta1, beta2 = out.pop("beta1", 0.9), out.pop("beta2", 0.999)
        if "betas" in accepted:
            out.setdefault("betas", (beta1, beta2))
    for pair, new in (
        (("eps1", "eps2"), "eps"),
        (("eta1", "eta2"), "etas"),
        (("step_size_min", "step_size_max"), "step_sizes"),
    ):
        if any(k in out for k in pair):
            values = tuple(out.pop(k) for k in pair if k in out)
            if new in accepted and len(values) == 2:
                out.setdefault(new, values)
    if "use_nesterov" in out:
        value = out.pop("use_nesterov")
        if "nesterov" in accepted:
            out.setdefault("nesterov", value)
    return out


def translate_scheduler_config(config: dict) -> dict:
    """One 1.x scheduler dict with its parameters renamed to the 2.x signature's names."""
    config = dict(config)
    probe = {"scheduler": config.get("scheduler")}
    try:
        cls, _ = _config.configure_scheduler_params(probe)
    except ValueError:
        return config  # unknown scheduler: let configure_lr_scheduler report it
    names = list(inspect.signature(cls.__init__).parameters)[2:]
    for new in names:
        if new in config:
            continue
        lowered = new.lower()
        if lowered != new and lowered in config:
            config[new] = config.pop(lowered)
            continue
        for old in _config._SCHEDULER_ALIASES.get(new, ()):
            if old in config and old not in names:
                config[new] = config.pop(old)
                break
    return config


def configure_optimizer(optimizer_type: str, params, **kwargs):
    """Builds a cstorch optimizer from a 1.x ``optimizer:`` config (1.x names accepted)."""
    return _config.configure_optimizer(
        optimizer_type, params, **translate_optimizer_params(optimizer_type, kwargs)
    )


def configure_lr_scheduler(optimizer, learning_rate, adjust_learning_rate=None):
    """Builds a cstorch LR scheduler from a 1.x ``learning_rate`` (float, dict or list)."""
    learning_rate = copy.deepcopy(learning_rate)
    if isinstance(learning_rate, dict):
        learning_rate = translate_scheduler_config(learning_rate)
    elif isinstance(learning_rate, (list, tuple)):
        learning_rate = [
            translate_scheduler_config(c) if isinstance(c, dict) else c for c in learning_rate
        ]
    return _config.configure_lr_scheduler(optimizer, learning_rate, adjust_learning_rate)
