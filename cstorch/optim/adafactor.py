"""cstorch Adafactor (update rule: ``jax_backend.optimizers.adafactor``)."""

from typing import Optional, Tuple

from torch.optim.optimizer import ParamsT

from cstorch.optim.optimizer import BuiltinOptimizer
from jax_backend.errors import CstorchValueError


class Adafactor(BuiltinOptimizer):
    """Adafactor with an external learning rate (``lr`` is required).

    State per parameter: ``exp_avg_sq_row`` (``shape[:-1]``) and ``exp_avg_sq_col``
    (``shape[:-2] + shape[-1:]``) for parameters with 2 or more dimensions, ``exp_avg_sq``
    otherwise, then ``step`` (the global step, float32). As in cerebras-pytorch 2.10 only
    ``clip_threshold=1.0``, ``beta1=None`` and ``relative_step=False`` are supported, and a
    group whose ``lr`` is None cannot be stepped (give it a value or a scheduler).
    """

    rule = "adafactor"
    hyperparameters = {
        "lr": "learning_rate",
        "eps": "eps",
        "clip_threshold": "clip_threshold",
        "decay_rate": "decay_rate",
        "beta1": "beta1",
        "weight_decay": "weight_decay",
        "scale_parameter": "scale_parameter",
        "relative_step": "relative_step",
        "warmup_init": "warmup_init",
    }
    global_step = True

    def __init__(
        self,
        params: ParamsT,
        lr: float,
        eps: Tuple[float, float] = (1e-30, 0.001),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        beta1: Optional[float] = None,
        weight_decay: float = 0.0,
        scale_parameter: bool = True,
        relative_step: bool = False,
        warmup_init: bool = False,
    ):
        if lr is not None and relative_step:
            raise CstorchValueError(
                "Cannot combine a manual `lr` with `relative_step=True`; pass one of them."
            )
        if warmup_init and not relative_step:
            raise CstorchValueError(
                "`warmup_init=True` needs `relative_step=True`, which is not "
                "supported; leave warmup_init=False."
            )
        if clip_threshold != 1.0:
            raise CstorchValueError(
                f"Only `clip_threshold=1.0` is supported, got {clip_threshold!r}."
            )
        if beta1 is not None:
            raise CstorchValueError(f"Only `beta1=None` is supported, got {beta1!r}.")
        if relative_step:
            raise CstorchValueError("`relative_step=True` is not supported; pass an explicit `lr`.")
        if (
            not isinstance(eps, (tuple, list))
            or len(eps) != 2
            or not all(isinstance(x, float) for x in eps)
        ):
            raise CstorchValueError(
                f"Expected `eps` to be a tuple/list of two floats, got {eps!r}."
            )
        defaults = dict(
            lr=lr,
            eps=eps,
            clip_threshold=clip_threshold,
            decay_rate=decay_rate,
            beta1=beta1,
            weight_decay=weight_decay,
            scale_parameter=scale_parameter,
            relative_step=relative_step,
            warmup_init=warmup_init,
        )
        super().__init__(params, defaults)

    def _check_group(self, group, params):
        if group["lr"] is None:
            raise CstorchValueError(
                "Adafactor: the learning rate of a param group is None. Pass `lr` to the "
                "constructor or attach a learning-rate scheduler to set it."
            )
