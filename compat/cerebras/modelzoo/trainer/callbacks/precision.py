"""Precision callbacks: how the step autocasts, backpropagates, clips and steps."""

from __future__ import annotations

import contextlib
import warnings
from abc import ABC, abstractmethod

import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback

HALF_TYPES = ("float16", "bfloat16", "cbfloat16")


class Precision(CoreCallback, ABC):
    """What the training step asks of a precision policy."""

    @abstractmethod
    def autocast_context_manager(self):
        """Context for the forward pass."""

    @abstractmethod
    def backward(self, loss):
        """Backpropagates ``loss``."""

    @abstractmethod
    def clip_gradients(self, optimizer):
        """Clips the gradients of ``optimizer``'s parameters."""

    @abstractmethod
    def optimizer_step(self, optimizer):
        """Steps ``optimizer``."""


def _positive_or_none(name, value):
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
    ):
        raise ValueError(f"{name} must be a positive number, got {value!r}.")


class MixedPrecision(Precision):
    """Mixed precision (half-precision compute, fp32 weights), loss scaling and clipping.

    ``loss_scaling_factor`` is a number or ``"dynamic"``; a grad scaler is used only for
    float16 (bfloat16 has the range of fp32). On CPU only bfloat16 exists (others become
    bfloat16 with a warning); off CSX ``cbfloat16`` becomes bfloat16.
    """

    def __init__(
        self,
        enabled=True,
        fp16_type="bfloat16",
        precision_opt_level=None,
        loss_scaling_factor=1.0,
        initial_loss_scale=None,
        steps_per_increase=2000,
        min_loss_scale=None,
        max_loss_scale=None,
        max_gradient_norm=None,
        max_gradient_value=None,
        log_loss_scale=None,
    ):
        if fp16_type not in HALF_TYPES:
            raise ValueError(
                f"fp16_type must be one of {', '.join(HALF_TYPES)}, got {fp16_type!r}."
            )
        if precision_opt_level is not None and precision_opt_level not in (0, 1, 2):
            raise ValueError(f"precision_opt_level must be 0, 1 or 2, got {precision_opt_level!r}.")
        if not (
            loss_scaling_factor == "dynamic"
            or (
                isinstance(loss_scaling_factor, (int, float))
                and not isinstance(loss_scaling_factor, bool)
                and loss_scaling_factor > 0
            )
        ):
            raise ValueError(
                f'loss_scaling_factor must be a positive number or "dynamic", '
                f"got {loss_scaling_factor!r}."
            )
        _positive_or_none("max_gradient_norm", max_gradient_norm)
        _positive_or_none("max_gradient_value", max_gradient_value)
        if max_gradient_norm is not None and max_gradient_value is not None:
            raise ValueError(
                "Gradients can be clipped by norm or by value, not both: set only one of "
                "max_gradient_norm and max_gradient_value."
            )
        self.enabled = bool(enabled)
        self.fp16_type = fp16_type
        self.precision_opt_level = precision_opt_level
        self.loss_scaling_factor = loss_scaling_factor
        self.initial_loss_scale = initial_loss_scale
        self.steps_per_increase = steps_per_increase
        self.min_loss_scale = min_loss_scale
        self.max_loss_scale = max_loss_scale
        self.max_gradient_norm = max_gradient_norm
        self.max_gradient_value = max_gradient_value
        self.log_loss_scale = log_loss_scale
        self.grad_scaler = None
        self._backend = None

    def setup(self, trainer):
        self._backend = trainer.backend
        if not self.enabled:
            if not trainer.backend.is_csx:
                cstorch.amp.enable_mixed_precision(False)
            return
        cstorch.amp.enable_mixed_precision(True)
        half = self.fp16_type
        if half == "cbfloat16" and not trainer.backend.is_csx:
            warnings.warn("cbfloat16 exists only on CSX; using bfloat16 instead.", stacklevel=2)
            half = "bfloat16"
        if trainer.backend.is_cpu and half != "bfloat16":
            warnings.warn(
                f"The CPU backend supports only bfloat16 mixed precision; using "
                f"bfloat16 instead of {half}.",
                stacklevel=2,
            )
            half = "bfloat16"
        self.fp16_type = half
        cstorch.amp.set_half_dtype(half)
        if self.precision_opt_level is not None:
            cstorch.backends.csx.precision.optimization_level = self.precision_opt_level
        if half != "bfloat16":
            self.grad_scaler = cstorch.amp.GradScaler(
                loss_scale=self.loss_scaling_factor,
                init_scale=self.initial_loss_scale,
                steps_per_increase=self.steps_per_increase,
                min_loss_scale=self.min_loss_scale,
                max_loss_scale=self.max_loss_scale,
            )

    def autocast_context_manager(self):
        if self.enabled and not self._backend.is_csx:
            return cstorch.amp.autocast()
        return contextlib.nullcontext()

    def backward(self, loss):
        if self.grad_scaler is not None:
            self.grad_scaler.scale(loss).backward()
        else:
            loss.backward()

    def clip_gradients(self, optimizer):
        if self.grad_scaler is not None:
            self.grad_scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if self.max_gradient_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.max_gradient_norm)
        elif self.max_gradient_value is not None:
            torch.nn.utils.clip_grad_value_(params, self.max_gradient_value)

    def optimizer_step(self, optimizer):
        if self.grad_scaler is not None:
            self.grad_scaler.step(optimizer)
            self.grad_scaler.update()
        else:
            optimizer.step()

    def on_after_optimizer_step(self, trainer, model, optimizer):
        if self.log_loss_scale and self.grad_scaler is not None:
            trainer.log_metrics(loss_scale=self.grad_scaler.get_scale())

    def on_save_checkpoint(self, trainer, state_dict):
        if self.grad_scaler is not None:
            state_dict["grad_scaler"] = self.grad_scaler.state_dict()

    def on_load_checkpoint(self, trainer, state_dict):
        if self.grad_scaler is not None and "grad_scaler" in state_dict:
            self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
