"""Builds (or takes) the model and compiles it for the backend."""

from __future__ import annotations

import warnings

import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback


class ModelCallback(CoreCallback):
    """``model`` is a ``torch.nn.Module`` or a zero-argument function returning one (called
    under the backend's device)."""

    def __init__(self, model):
        self.model = model

    def setup(self, trainer):
        if isinstance(self.model, torch.nn.Module):
            model = self.model
        elif callable(self.model):
            with trainer.backend.device:
                model = self.model()
            if not isinstance(model, torch.nn.Module):
                raise TypeError(
                    f"The model factory returned {type(model).__name__}; it must return a "
                    "torch.nn.Module."
                )
        else:
            raise ValueError(
                f"Expected model to be a torch.nn.Module or a callable that returns one, got "
                f"{type(self.model).__name__}."
            )
        trainer.model = model
        trainer.compiled_model = cstorch.compile(model, trainer.backend)

    def on_train_start(self, trainer, model, train_dataloader, loop, loop_idx):
        model.train()

    def on_enter_validate(self, trainer, stack, val_dataloader, loop):
        # (not on_validate_start: a ValidationLoop(hook=...) renames that hook)
        trainer.model.eval()

    def on_before_backward(self, trainer, model, outputs):
        if "loss" not in outputs:
            raise ValueError(
                f"Expected the forward call of {type(model).__name__} to return the loss (a "
                f"tensor, or a dict with a 'loss' key). Got keys: {sorted(outputs)}."
            )

    def on_save_checkpoint(self, trainer, state_dict):
        state_dict["model"] = trainer.model.state_dict()

    def on_load_checkpoint(self, trainer, state_dict):
        if "model" not in state_dict:
            warnings.warn(
                "The checkpoint has no model state; the model was not loaded.", stacklevel=2
            )
            return
        strict = not trainer.checkpoint.disable_strict_checkpoint_loading
        weights = state_dict["model"]
        inner = getattr(trainer.model, "model", None)
        if isinstance(inner, torch.nn.Module) and not all(k.startswith("model.") for k in weights):
            inner.load_state_dict(weights, strict=strict)  # pre-2.0 checkpoints: no prefix
        else:
            trainer.model.load_state_dict(weights, strict=strict)
        trainer.logger.info("Model state found in checkpoint and loaded successfully.")
