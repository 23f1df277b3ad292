"""The training dataloader in checkpoints, and summaries of the batches it produces."""

from __future__ import annotations

import torch

from cerebras.modelzoo.trainer.callbacks.callback import Callback, CoreCallback


class DataLoaderCallback(CoreCallback):
    """Holds the training dataloader during fit; checkpoints its state if it is restartable."""

    def __init__(self):
        self.dataloader = None

    def on_enter_fit(self, trainer, stack, train_dataloader, val_dataloader, loop):
        self.dataloader = train_dataloader
        stack.callback(setattr, self, "dataloader", None)

    def on_save_checkpoint(self, trainer, state_dict):
        if self.dataloader is not None and self.dataloader.is_restartable:
            state_dict["dataloader"] = self.dataloader.state_dict()

    def on_load_checkpoint(self, trainer, state_dict):
        if self.dataloader is None or not self.dataloader.is_restartable:
            return
        if "dataloader" in state_dict:
            self.dataloader.load_state_dict(
                state_dict["dataloader"],
                strict=not trainer.checkpoint.disable_strict_checkpoint_loading,
            )
            trainer.logger.info("Dataloader state found in checkpoint and loaded successfully.")
        else:
            trainer.logger.info(
                "The checkpoint has no dataloader state; the dataloader starts from the beginning."
            )


def _named_tensors(value, name):
    """``(dotted name, tensor)`` for every tensor of a nested batch (dicts, lists, tuples)."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _named_tensors(item, f"{name}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _named_tensors(item, f"{name}.{index}")


class LogInputSummaries(Callback):
    """Logs every tensor of every batch (``input.0``, ``input.<key>``, ...), as each step
    sees it (logged from inside the compiled step)."""

    def on_before_forward(self, trainer, model, batch, args, kwargs):
        trainer.log_metrics(**dict(_named_tensors(batch, "input")))
