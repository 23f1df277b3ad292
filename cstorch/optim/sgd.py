"""cstorch SGD (update rule: ``jax_backend.optimizers.sgd``)."""

from __future__ import annotations

from cstorch.optim.optimizer import BuiltinOptimizer


class SGD(BuiltinOptimizer):
    """SGD with momentum; the momentum buffer starts at zero (cerebras-pytorch semantics)."""

    rule = "sgd"
    hyperparameters = {"lr": "learning_rate", "momentum": "momentum", "dampening": "dampening",
                       "weight_decay": "weight_decay", "nesterov": "nesterov",
                       "maximize": "maximize"}

    def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 maximize=False):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(
                "Nesterov momentum requires a `momentum` and zero `dampening`. `momentum` was "
                f"{momentum} and `dampening` was {dampening}.")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults)
