"""cstorch RMSprop (update rule: ``jax_backend.optimizers.rmsprop``)."""

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class RMSprop(BuiltinOptimizer):
    """RMSprop (torch's algorithm). State: ``square_avg``, ``momentum_buffer`` (if
    ``momentum > 0``), ``grad_avg`` (if ``centered``)."""

    rule = "rmsprop"
    hyperparameters = {
        "lr": "learning_rate",
        "alpha": "alpha",
        "eps": "eps",
        "weight_decay": "weight_decay",
        "momentum": "momentum",
        "centered": "centered",
    }

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.01,
        alpha: float = 0.99,
        eps: float = 1e-08,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
    ):
        _checks.non_negative("learning rate", lr)
        _checks.non_negative("epsilon value", eps)
        _checks.non_negative("momentum value", momentum)
        _checks.non_negative("weight_decay value", weight_decay)
        _checks.non_negative("alpha value", alpha)
        defaults = dict(
            lr=lr,
            momentum=momentum,
            alpha=alpha,
            eps=eps,
            centered=centered,
            weight_decay=weight_decay,
        )
        super().__init__(params, defaults)
