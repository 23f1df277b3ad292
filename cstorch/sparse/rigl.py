"""``RigL``: rigging the lottery (https://arxiv.org/abs/1911.11134)."""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from cstorch.sparse.dynamic import DynamicSparsityAlgorithm
from cstorch.sparse.utils import (
    HyperParameterScheduleType,
    InputGroupScoreShaper,
    OutputGroupScoreShaper,
    make_hyperparam_schedule,
    make_mask_drop_minimum,
    make_mask_grow_maximum,
)
from jax_backend.errors import CstorchRuntimeError, CstorchValueError


class RigL(DynamicSparsityAlgorithm):
    """Constant sparsity; each update drops the ``drop_fraction`` smallest ``|w|`` of the
    present connections and regrows where the dense gradient's magnitude is largest.

    ``balance_out_groups`` / ``balance_in_groups`` (at most one) make every group of output
    rows / input columns keep the same number of connections."""

    def __init__(
        self,
        drop_fraction: HyperParameterScheduleType = 0.3,
        balance_in_groups: Optional[int] = None,
        balance_out_groups: Optional[int] = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.drop_fraction = make_hyperparam_schedule(drop_fraction)
        self.balance_in_groups = balance_in_groups
        self.balance_out_groups = balance_out_groups
        self.score_shaper = None
        self._dense_grads = {}  # id(param) -> the unmasked gradient of this step

    def _extra_schedules(self):
        return [("drop_fraction", self.drop_fraction)]

    def sparsify_parameter(self, module, name, param) -> None:
        if param is not None:
            if self.balance_in_groups and self.balance_out_groups:
                raise CstorchValueError(
                    "Only one of `balance_in_groups` and `balance_out_groups` can be "
                    "specified at a time."
                )
            if self.score_shaper is None:
                if self.balance_out_groups:
                    self.score_shaper = OutputGroupScoreShaper(self.balance_out_groups)
                elif self.balance_in_groups:
                    self.score_shaper = InputGroupScoreShaper(self.balance_in_groups)
                if self.score_shaper is not None:
                    self.init_method = partial(self.init_method, score_shaper=self.score_shaper)
            self._validate_balance(name, param)
        super().sparsify_parameter(module, name, param)

    def _validate_balance(self, name, param) -> None:
        """Every balanced parameter must split into the groups (checked for each one, where
        the reference checked the first only and failed later for the others)."""
        for key, groups in (
            ("balance_out_groups", self.balance_out_groups),
            ("balance_in_groups", self.balance_in_groups),
        ):
            if groups and not any(dim % groups == 0 for dim in param.shape):
                raise CstorchValueError(
                    f"Sparsity group configured with `{key}`={groups} but parameter {name} "
                    f"does not have a dimension with a multiple of {groups}: "
                    f"{tuple(param.shape)}"
                )
        if self.balance_in_groups and param.dim() != 2:
            raise CstorchValueError(
                f"`balance_in_groups` needs 2-D weights, but parameter {name} has shape "
                f"{tuple(param.shape)}. Leave it out with a param_filter (e.g. a Group for "
                "the weights only)."
            )

    def _grad_hook(self, sparse_param, grad):
        key = id(sparse_param.param)
        if key in self._dense_grads:  # gradient accumulation
            self._dense_grads[key] = self._dense_grads[key] + grad
        else:
            self._dense_grads[key] = grad.clone()
        return super()._grad_hook(sparse_param, grad)

    def sparsify_optimizer(self, optimizer) -> None:
        super().sparsify_optimizer(optimizer)

        def clear_dense_grads(optimizer, args, kwargs):
            self._dense_grads = {}

        self.zero_grad_post_hook = optimizer.register_zero_grad_post_hook(clear_dense_grads)

    @torch.no_grad()
    def update_mask(self, p, mask, sparsity):
        dense_grad = self._dense_grads.get(id(p))
        if dense_grad is None:
            raise CstorchRuntimeError(
                "RigL requires dense gradients: run the model's forward and loss.backward() "
                "before optimizer.step() in the same step."
            )
        drop_fraction = self.drop_fraction(self.step)
        self.drop_fraction.update(self.is_update_step)
        when = self.is_update_step
        dropped, kept = make_mask_drop_minimum(
            p.abs(), mask, drop_fraction, score_shaper=self.score_shaper, when=when
        )
        return make_mask_grow_maximum(
            dense_grad.abs(), dropped, sparsity, kept, score_shaper=self.score_shaper, when=when
        )
