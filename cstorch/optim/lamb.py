"""cstorch Lamb (update rule: ``jax_backend.optimizers.lamb``)."""

from __future__ import annotations

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class Lamb(BuiltinOptimizer):
    """Lamb (no bias correction). State: ``exp_avg``, ``exp_avg_sq``.

    The trust ratio is ``clamp(‖p‖, 0, 10)/‖adam step‖``, 1 if either norm is 0 or with
    ``adam=True``.
    """

    rule = "lamb"
    hyperparameters = {"lr": "learning_rate", "betas": "betas", "eps": "eps",
                       "weight_decay": "weight_decay", "adam": "adam"}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0,
                 adam=False):
        _checks.non_negative("learning rate", lr)
        _checks.non_negative("epsilon value", eps)
        _checks.betas(betas)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adam=adam)
        super().__init__(params, defaults)
