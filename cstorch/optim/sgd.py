"""cstorch SGD (update rule: ``jax_backend.optimizers.sgd``)."""

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer
from jax_backend.errors import CstorchValueError


class SGD(BuiltinOptimizer):
    """SGD with momentum; ``lr`` is required.

    The momentum buffer (``momentum_buffer``, only when ``momentum != 0``) starts at zero, so
    unlike torch the first step already applies ``1 - dampening``.
    """

    rule = "sgd"
    hyperparameters = {
        "lr": "learning_rate",
        "momentum": "momentum",
        "dampening": "dampening",
        "weight_decay": "weight_decay",
        "nesterov": "nesterov",
        "maximize": "maximize",
    }

    def __init__(
        self,
        params: ParamsT,
        lr: float,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        maximize: bool = False,
    ):
        _checks.non_negative("learning rate", lr)
        _checks.non_negative("momentum value", momentum)
        _checks.non_negative("weight_decay value", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise CstorchValueError(
                "Nesterov momentum requires a `momentum` and zero `dampening`. `momentum` was "
                f"{momentum} and `dampening` was {dampening}."
            )
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
        )
        super().__init__(params, defaults)
