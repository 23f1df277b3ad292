"""cstorch Lamb (update rule: ``jax_backend.optimizers.lamb``)."""

from typing import Tuple

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class Lamb(BuiltinOptimizer):
    """Lamb (no bias correction). State: ``exp_avg``, ``exp_avg_sq``.

    The trust ratio is ``clamp(‖p‖, 0, 10)/‖adam step‖``, 1 if either norm is 0 or with
    ``adam=True``.
    """

    rule = "lamb"
    hyperparameters = {
        "lr": "learning_rate",
        "betas": "betas",
        "eps": "eps",
        "weight_decay": "weight_decay",
        "adam": "adam",
    }

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.001,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-06,
        weight_decay: float = 0,
        adam: bool = False,
    ):
        _checks.non_negative("learning rate", lr)
        _checks.non_negative("epsilon value", eps)
        _checks.betas(betas)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adam=adam)
        super().__init__(params, defaults)
