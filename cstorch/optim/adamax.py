"""cstorch Adamax (update rule: ``jax_backend.optimizers.adamax``)."""

from typing import Tuple

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class Adamax(BuiltinOptimizer):
    """Adamax. State: ``exp_avg``, ``exp_inf`` (zeros), ``beta1_power`` (starts at β1).

    ``exp_inf = max(β2·exp_inf, |g| + eps)`` (eps inside the max) and the bias correction uses
    the stored ``beta1_power``; the default ``eps`` is 1e-6.
    """

    rule = "adamax"
    hyperparameters = {
        "lr": "learning_rate",
        "betas": "betas",
        "eps": "eps",
        "weight_decay": "weight_decay",
        "maximize": "maximize",
    }

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.001,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-06,
        weight_decay: float = 0.0,
        maximize: bool = False,
    ):
        _checks.non_negative("learning rate", lr)
        _checks.betas(betas)
        _checks.non_negative("epsilon value", eps)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults)
