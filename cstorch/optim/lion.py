"""cstorch Lion (update rule: ``jax_backend.optimizers.lion``)."""

from typing import Tuple

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class Lion(BuiltinOptimizer):
    """Lion with decoupled weight decay (``p *= 1 - lr·wd``). State: ``exp_avg``."""

    rule = "lion"
    hyperparameters = {"lr": "learning_rate", "betas": "betas", "weight_decay": "weight_decay"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.0001,
        betas: Tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ):
        _checks.non_negative("learning rate", lr)
        _checks.betas(betas)
        _checks.non_negative("weight decay value", weight_decay)
        defaults = dict(lr=lr, betas=betas, weight_decay=weight_decay)
        super().__init__(params, defaults)
