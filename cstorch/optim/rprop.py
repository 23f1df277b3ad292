"""cstorch Rprop (update rule: ``jax_backend.optimizers.rprop``)."""

from typing import Tuple

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer


class Rprop(BuiltinOptimizer):
    """Rprop. State: ``prev`` (zeros), ``step_size`` (full of ``lr``); ``lr`` only sets the
    initial step size."""

    rule = "rprop"
    hyperparameters = {"lr": "learning_rate", "etas": "etas", "step_sizes": "step_sizes"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.001,
        etas: Tuple[float, float] = (0.5, 1.2),
        step_sizes: Tuple[float, float] = (1e-06, 50.0),
    ):
        _checks.non_negative("learning rate", lr)
        defaults = dict(lr=lr, etas=etas, step_sizes=step_sizes)
        super().__init__(params, defaults)
