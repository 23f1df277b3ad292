"""cstorch NAdam (update rule: ``jax_backend.optimizers.nadam``)."""

from typing import Tuple

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class NAdam(BuiltinOptimizer):
    """NAdam. State: ``mu_product`` (starts at 1), ``exp_avg``, ``exp_avg_sq``, then ``step``.

    As in cerebras-pytorch 2.10, the momentum term's denominator counts ``μ_t`` twice
    (``1 - Π·μ_t·μ_{t+1}``; torch uses ``1 - Π·μ_{t+1}``).
    """

    rule = "nadam"
    hyperparameters = {
        "lr": "learning_rate",
        "betas": "betas",
        "eps": "eps",
        "weight_decay": "weight_decay",
        "momentum_decay": "momentum_decay",
    }
    global_step = True

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.002,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-08,
        weight_decay: float = 0,
        momentum_decay: float = 0.004,
    ):
        _checks.non_negative("learning rate", lr)
        _checks.non_negative("epsilon value", eps)
        _checks.betas(betas)
        _checks.non_negative("weight_decay value", weight_decay)
        _checks.non_negative("momentum_decay value", momentum_decay)
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, momentum_decay=momentum_decay
        )
        super().__init__(params, defaults)
