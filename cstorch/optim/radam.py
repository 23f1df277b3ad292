"""cstorch RAdam (update rule: ``jax_backend.optimizers.radam``)."""

from typing import Tuple

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class RAdam(BuiltinOptimizer):
    """RAdam (rectified once ``ρ_t > 5``). State: ``exp_avg``, ``exp_avg_sq``, then ``step``;
    the default ``eps`` is 1e-6."""

    rule = "radam"
    hyperparameters = {
        "lr": "learning_rate",
        "betas": "betas",
        "eps": "eps",
        "weight_decay": "weight_decay",
    }
    global_step = True

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.001,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-06,
        weight_decay: float = 0.0,
    ):
        _checks.non_negative("learning rate", lr)
        _checks.betas(betas)
        _checks.non_negative("weight_decay value", weight_decay)
        _checks.non_negative("epsilon value", eps)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
