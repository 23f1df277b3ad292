"""cstorch Adam and AdamW (update rule: ``jax_backend.optimizers.adam_base``).

Numerics differ from torch's Adam: eps is added to sqrt(v) *before* the bias correction is
applied, the bias correction keeps ``beta^t`` as per-parameter state (``beta1_power``,
``beta2_power``), and the default eps is 1e-6.
"""

from typing import Tuple

import torch
from torch.optim.optimizer import ParamsT

from cstorch.optim.optimizer import BuiltinOptimizer
from jax_backend.errors import CstorchValueError


def _shallow_copy(state_dict):
    """A copy whose per-parameter states and groups can be changed without touching the
    caller's state_dict."""
    state_dict = dict(state_dict)
    state_dict["state"] = {k: dict(v) for k, v in state_dict["state"].items()}
    state_dict["param_groups"] = [dict(g) for g in state_dict["param_groups"]]
    return state_dict


class AdamBase(BuiltinOptimizer):
    rule = "adam_base"
    hyperparameters = {
        "lr": "learning_rate",
        "betas": "betas",
        "eps": "eps",
        "weight_decay": "weight_decay",
        "l2_regularization_rate": "l2_regularization_rate",
        "correct_bias": "correct_bias",
        "amsgrad": "amsgrad",
    }

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.001,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-06,
        weight_decay: float = 0.0,
        l2_regularization_rate: float = 0.0,
        correct_bias: bool = True,
        amsgrad: bool = False,
    ):
        if lr < 0.0:
            raise CstorchValueError(f"Invalid learning rate: {lr} - should be >= 0.0")
        for beta in betas:
            if not 0.0 <= beta < 1.0:
                raise CstorchValueError(f"Invalid beta parameter: {beta} - should be in [0.0, 1.0)")
        if eps < 0.0:
            raise CstorchValueError(f"Invalid epsilon value: {eps} - should be >= 0.0")
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            l2_regularization_rate=l2_regularization_rate,
            correct_bias=correct_bias,
            amsgrad=amsgrad,
        )
        super().__init__(params, defaults)

    def load_state_dict(self, state_dict):
        """Also accepts torch/HuggingFace Adam states that keep ``step`` instead of powers.

        Differs from cerebras-pytorch 2.10, which converts ``step`` to ``beta**step``: after
        ``step`` updates this implementation's own state holds ``beta**(step+1)`` (the power
        for the *next* update), so that is what a converted state gets."""
        state_dict = _shallow_copy(state_dict)
        for param, state in state_dict["state"].items():
            if "step" in state and "beta1_power" not in state:
                step = float(state.pop("step"))
                for group in state_dict["param_groups"]:
                    if param in group["params"]:
                        if group.get("correct_bias", True):
                            beta1, beta2 = group["betas"]
                            state["beta1_power"] = torch.tensor(
                                beta1 ** (step + 1), dtype=torch.float32
                            )
                            state["beta2_power"] = torch.tensor(
                                beta2 ** (step + 1), dtype=torch.float32
                            )
                        break
        super().load_state_dict(state_dict)


class AdamW(AdamBase):
    """AdamW: decoupled weight decay (``update += wd·p`` after the bias correction)."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.001,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-06,
        weight_decay: float = 0.0,
        correct_bias: bool = True,
        amsgrad: bool = False,
    ):
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            l2_regularization_rate=0.0,
            correct_bias=correct_bias,
            amsgrad=amsgrad,
        )
        for group in self.param_groups:
            group["l2_regularization_rate"] = 0.0

    def load_state_dict(self, state_dict):
        state_dict = _shallow_copy(state_dict)
        for group in state_dict["param_groups"]:
            group["l2_regularization_rate"] = 0.0
        super().load_state_dict(state_dict)


class Adam(AdamBase):
    """Adam: ``weight_decay`` is coupled L2 regularisation (stored as l2_regularization_rate)."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.001,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-06,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
    ):
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=0.0,
            l2_regularization_rate=weight_decay,
            correct_bias=True,
            amsgrad=amsgrad,
        )
        self._move_weight_decay(self.param_groups)

    @staticmethod
    def _move_weight_decay(param_groups):
        for group in param_groups:
            group.setdefault("l2_regularization_rate", group.pop("weight_decay", 0.0))
            group["weight_decay"] = 0.0
            group["correct_bias"] = True

    def load_state_dict(self, state_dict):
        state_dict = _shallow_copy(state_dict)
        self._move_weight_decay(state_dict["param_groups"])
        super().load_state_dict(state_dict)
