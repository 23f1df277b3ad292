"""cstorch Adagrad (update rule: ``jax_backend.optimizers.adagrad``)."""

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class Adagrad(BuiltinOptimizer):
    """Adagrad. State: ``sum`` (full of ``initial_accumulator_value``), then ``step``.

    ``p -= lr·g/(1 + (step-1)·lr_decay)/(√sum + eps)``; the default ``eps`` is 1e-6 (torch:
    1e-10).
    """

    rule = "adagrad"
    hyperparameters = {
        "lr": "learning_rate",
        "lr_decay": "lr_decay",
        "weight_decay": "weight_decay",
        "initial_accumulator_value": "initial_accumulator_value",
        "eps": "eps",
        "maximize": "maximize",
    }
    global_step = True

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.01,
        lr_decay: float = 0,
        weight_decay: float = 0,
        initial_accumulator_value: float = 0,
        eps: float = 1e-06,
        maximize: bool = False,
    ):
        _checks.non_negative("learning rate", lr)
        _checks.non_negative("lr_decay value", lr_decay)
        _checks.non_negative("weight_decay value", weight_decay)
        _checks.non_negative("initial_accumulator_value value", initial_accumulator_value)
        _checks.non_negative("epsilon value", eps)
        defaults = dict(
            lr=lr,
            lr_decay=lr_decay,
            eps=eps,
            weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value,
            maximize=maximize,
        )
        super().__init__(params, defaults)
