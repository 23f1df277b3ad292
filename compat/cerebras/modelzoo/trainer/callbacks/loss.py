"""Loss logging and loss checks."""

from __future__ import annotations

import math

import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import Callback, CoreCallback


def _as_float(loss) -> float:
    return float(loss.float().item()) if isinstance(loss, torch.Tensor) else float(loss)


class LossAccumulationCallback(CoreCallback):
    """Logs ``loss`` after each training step and ``loss`` (the mean) after a validation."""

    def __init__(self):
        self.val_total = 0.0
        self.val_count = 0
        self.avg_eval_loss = None

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        if "loss" in outputs:
            self._log_train_loss(trainer, outputs["loss"])

    @cstorch.step_closure
    def _log_train_loss(self, trainer, loss):
        trainer.log_metrics(loss=_as_float(loss))

    def on_validate_start(self, trainer, model, val_dataloader, loop):
        self.val_total, self.val_count = 0.0, 0

    def on_validate_batch_end(self, trainer, model, outputs, batch, batch_idx):
        if "loss" in outputs:
            self._accumulate_val_loss(trainer, outputs["loss"])

    @cstorch.step_closure
    def _accumulate_val_loss(self, trainer, loss):
        self.val_total += _as_float(loss)
        self.val_count += 1
        if trainer.is_final_iteration:
            self.avg_eval_loss = self.val_total / self.val_count
            trainer.log_metrics(loss=self.avg_eval_loss)

    def on_validate_end(self, trainer, model, loop):
        if self.avg_eval_loss is not None:
            trainer.logger.info(f"Avg eval loss: {self.avg_eval_loss}")


class CheckLoss(Callback):
    """Checks that the loss is a scalar tensor, and stops the run on a NaN or inf loss."""

    def on_after_forward(self, trainer, model, outputs, batch):
        if "loss" not in outputs:
            return
        loss = outputs["loss"]
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                f"Expected the loss to be a scalar torch.Tensor, got {type(loss).__name__}."
            )
        if loss.numel() != 1:
            raise TypeError(
                f"Expected the loss to be a scalar torch.Tensor, got shape {tuple(loss.shape)}."
            )

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        if "loss" in outputs:
            self._check(trainer, outputs["loss"])

    @cstorch.step_closure
    def _check(self, trainer, loss):
        value = _as_float(loss)
        if not math.isfinite(value):
            raise ValueError(
                f"The loss is {value} at global step {trainer.global_step}. Training is "
                "diverging: lower the learning rate, enable gradient clipping "
                "(MixedPrecision(max_gradient_norm=...)) or check the inputs."
            )
