"""Builds (or takes) the optimizer; saves and restores its state; logs param-group values."""

from __future__ import annotations

import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import Callback, CoreCallback


class OptimizerCallback(CoreCallback):
    """``optimizer`` is a ``cstorch.optim.Optimizer``, a function ``model -> Optimizer``, or
    None (validation only)."""

    def __init__(self, optimizer=None):
        self.optimizer = optimizer

    def setup(self, trainer):
        if self.optimizer is None or isinstance(self.optimizer, cstorch.optim.Optimizer):
            trainer.optimizer = self.optimizer
            return
        if not callable(self.optimizer):
            raise TypeError(
                f"Expected optimizer to be a cstorch.optim.Optimizer or a function taking the "
                f"model and returning one, got {type(self.optimizer).__name__}."
            )
        optimizer = self.optimizer(trainer.model)
        if not isinstance(optimizer, cstorch.optim.Optimizer):
            raise TypeError(
                f"The optimizer factory returned {type(optimizer).__name__}; it must return a "
                "cstorch.optim.Optimizer."
            )
        trainer.optimizer = optimizer

    def on_fit_start(self, trainer, train_dataloader, val_dataloader, loop):
        if trainer.optimizer is None:
            raise RuntimeError(
                "fit needs an optimizer: pass optimizer= to the Trainer "
                "(a cstorch.optim.Optimizer or a function of the model)."
            )

    def on_save_checkpoint(self, trainer, state_dict):
        if trainer.optimizer is not None:
            state_dict["optimizer"] = trainer.optimizer.state_dict()

    def on_load_checkpoint(self, trainer, state_dict):
        if trainer.optimizer is None:
            return
        if "optimizer" in state_dict:
            trainer.optimizer.load_state_dict(state_dict["optimizer"])
            trainer.logger.info("Optimizer state found in checkpoint and loaded successfully.")
        else:
            trainer.logger.info(
                "The checkpoint has no optimizer state; the optimizer keeps its initial state."
            )


class LogOptimizerParamGroup(Callback):
    """Logs param-group values (e.g. ``"lr"``) of every group after each optimizer step, as
    ``<key>/<group index>``."""

    def __init__(self, keys):
        if isinstance(keys, str):
            keys = [keys]
        keys = list(keys) if not isinstance(keys, (bytes, dict)) else None
        if not keys or not all(isinstance(k, str) for k in keys):
            raise ValueError("LogOptimizerParamGroup(keys) takes a key name or a list of them.")
        self.keys = keys

    def setup(self, trainer):
        if trainer.optimizer is None:
            return
        for key in self.keys:
            for group in trainer.optimizer.param_groups:
                if key not in group:
                    raise ValueError(
                        f"Key {key!r} not found in the optimizer's param_groups "
                        f"(they have {sorted(k for k in group if k != 'params')})."
                    )

    def on_after_optimizer_step(self, trainer, model, optimizer):
        # Trace-time: log_metrics defers to a step closure, which reads each step's values.
        # A closure sees its tensors' values at the end of the step, and the schedulers update
        # these in place after this hook: clone to log the value this step used.
        metrics = {}
        for key in self.keys:
            for index, group in enumerate(optimizer.param_groups):
                value = group[key]
                metrics[f"{key}/{index}"] = (
                    value.clone() if isinstance(value, torch.Tensor) else value
                )
        trainer.log_metrics(**metrics)
