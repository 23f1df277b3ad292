"""cstorch Lion (update rule: ``jax_backend.optimizers.lion``)."""

from __future__ import annotations

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class Lion(BuiltinOptimizer):
    """Lion with decoupled weight decay (``p *= 1 - lr·wd``). State: ``exp_avg``."""

    rule = "lion"
    hyperparameters = {"lr": "learning_rate", "betas": "betas", "weight_decay": "weight_decay"}

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        _checks.non_negative("learning rate", lr)
        _checks.betas(betas)
        _checks.non_negative("weight decay value", weight_decay)
        defaults = dict(lr=lr, betas=betas, weight_decay=weight_decay)
        super().__init__(params, defaults)
