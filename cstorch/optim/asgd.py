"""cstorch ASGD (update rule: ``jax_backend.optimizers.asgd``)."""

from __future__ import annotations

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class ASGD(BuiltinOptimizer):
    """Averaged SGD (torch's algorithm). State: ``eta`` (= lr), ``mu`` (= 1), ``ax``
    (zeros), then ``step``."""

    rule = "asgd"
    hyperparameters = {"lr": "learning_rate", "lambd": "lambd", "alpha": "alpha", "t0": "t0",
                       "weight_decay": "weight_decay", "maximize": "maximize"}
    global_step = True

    def __init__(self, params, lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0,
                 maximize=False):
        _checks.non_negative("learning rate", lr)
        _checks.non_negative("weight_decay value", weight_decay)
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                        maximize=maximize)
        super().__init__(params, defaults)
