"""cstorch ASGD (update rule: ``jax_backend.optimizers.asgd``)."""

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class ASGD(BuiltinOptimizer):
    """Averaged SGD (torch's algorithm). State: ``eta`` (= lr), ``mu`` (= 1), ``ax``
    (zeros), then ``step``."""

    rule = "asgd"
    hyperparameters = {
        "lr": "learning_rate",
        "lambd": "lambd",
        "alpha": "alpha",
        "t0": "t0",
        "weight_decay": "weight_decay",
        "maximize": "maximize",
    }
    global_step = True

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.01,
        lambd: float = 0.0001,
        alpha: float = 0.75,
        t0: float = 1000000.0,
        weight_decay: float = 0,
        maximize: bool = False,
    ):
        _checks.non_negative("learning rate", lr)
        _checks.non_negative("weight_decay value", weight_decay)
        defaults = dict(
            lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay, maximize=maximize
        )
        super().__init__(params, defaults)
