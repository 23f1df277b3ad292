"""cstorch Muon (update rule: ``jax_backend.optimizers.muon``)."""

from torch.optim.optimizer import ParamsT

from cstorch.optim import _checks
from cstorch.optim.optimizer import BuiltinOptimizer
from jax_backend.errors import CstorchValueError


class Muon(BuiltinOptimizer):
    """Muon: momentum SGD whose update is orthogonalised by ``ns_steps`` Newton–Schulz
    iterations (in bfloat16), with ``lr`` scaled by ``0.2·√max(rows, cols)``.

    State: ``momentum_buffer`` (zeros, only when ``momentum != 0``). Every parameter must have
    2 or more dimensions (4-d ones are flattened to ``(shape[0], -1)``); optimize biases and
    norms with another optimizer.

    Differs from cerebras-pytorch 2.10, whose ``step`` raises TypeError off CSX (its
    Newton–Schulz helper lacks ``self``) and never writes the momentum buffer back: here the
    step is the update the reference's formula describes, and the buffer persists.
    """

    rule = "muon"
    hyperparameters = {
        "lr": "learning_rate",
        "weight_decay": "weight_decay",
        "momentum": "momentum",
        "nesterov": "nesterov",
        "ns_steps": "ns_steps",
    }

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.02,
        weight_decay: float = 0.01,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
    ):
        _checks.non_negative("learning rate", lr)
        _checks.in_unit_interval("weight decay parameter", weight_decay)
        _checks.in_unit_interval("momentum parameter", momentum)
        if ns_steps < 0:
            raise CstorchValueError(f"Invalid number of steps: {ns_steps!r} - should be >= 0")
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
        )
        super().__init__(params, defaults)

    def _check_group(self, group, params):
        for p in params:
            if p.ndim < 2:
                raise CstorchValueError(
                    f"Muon needs parameters with 2 or more dimensions, got one of shape "
                    f"{tuple(p.shape)}; optimize 0-d/1-d parameters with another optimizer "
                    "(e.g. AdamW in a separate optimizer)."
                )
