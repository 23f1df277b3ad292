"""cstorch Adadelta (update rule: ``jax_backend.optimizers.adadelta``)."""

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class Adadelta(BuiltinOptimizer):
    """Adadelta (torch's algorithm). State: ``square_avg``, ``acc_delta`` (zeros)."""

    rule = "adadelta"
    hyperparameters = {
        "lr": "learning_rate",
        "rho": "rho",
        "eps": "eps",
        "weight_decay": "weight_decay",
        "maximize": "maximize",
    }

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-06,
        weight_decay: float = 0,
        maximize: bool = False,
    ):
        _checks.non_negative("learning rate", lr)
        _checks.in_unit_interval("rho value", rho, include_one=True)
        _checks.non_negative("epsilon value", eps)
        _checks.non_negative("weight_decay value", weight_decay)
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults)
