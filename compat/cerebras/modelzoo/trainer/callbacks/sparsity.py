"""The sparsity slot of the Trainer: applies a ``cstorch.sparse`` algorithm to the model and
the optimizer, checkpoints its state, and (``LogSparsity``) logs each mask's sparsity."""

from __future__ import annotations

import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import Callback, CoreCallback
from cstorch.sparse.configure import check_config


def _resolve(sparsity):
    """A ``SparsityAlgorithm``; a function returning one; or a ``cstorch.sparse.configure``
    config (a float, a dict or a list of dicts, as YAML gives it)."""
    if sparsity is None or isinstance(sparsity, cstorch.sparse.SparsityAlgorithm):
        return sparsity
    if isinstance(sparsity, (int, float, dict, list)):
        return cstorch.sparse.configure(sparsity)
    if callable(sparsity):
        algorithm = sparsity()
        if algorithm is not None and not isinstance(algorithm, cstorch.sparse.SparsityAlgorithm):
            raise TypeError(
                f"The sparsity factory returned {type(algorithm).__name__}; it must "
                "return a cstorch.sparse.SparsityAlgorithm."
            )
        return algorithm
    raise TypeError(
        f"Expected sparsity to be a cstorch.sparse.SparsityAlgorithm, a function "
        f"returning one, or a sparsity config, got {type(sparsity).__name__}."
    )


class SparsityCallback(CoreCallback):
    """Runs after the model, optimizer and scheduler callbacks: sparsifies the model (masks
    become ``<name>_mask`` buffers, so they are saved with the model) and the optimizer
    (gradients are masked and the optimizer state pruned inside the compiled step)."""

    def __init__(self, sparsity=None):
        if isinstance(sparsity, (int, float, dict, list)):  # a config: checked before building
            check_config(sparsity)
        self.sparsity = sparsity

    def setup(self, trainer):
        trainer.sparsity = _resolve(self.sparsity)
        if trainer.sparsity is None:
            return
        trainer.model.apply(trainer.sparsity)
        if trainer.optimizer is not None:
            trainer.optimizer.apply(trainer.sparsity)

    def on_save_checkpoint(self, trainer, state_dict):
        if trainer.sparsity is not None:
            state_dict["sparsity"] = trainer.sparsity.state_dict()

    def on_load_checkpoint(self, trainer, state_dict):
        if trainer.sparsity is not None and "sparsity" in state_dict:
            trainer.sparsity.load_state_dict(state_dict["sparsity"])


class LogSparsity(Callback):
    """Logs ``sparsity/<parameter>`` (the fraction of pruned weights) of every sparse parameter
    after each optimizer step; computed inside the compiled step from the masks."""

    def on_after_optimizer_step(self, trainer, model, optimizer):
        for name, mask in model.named_buffers():
            if name.endswith("_mask") and mask.dtype == torch.bool:
                pruned = 1.0 - mask.float().mean()
                trainer.log_metrics(**{f"sparsity/{name[: -len('_mask')]}": pruned})
