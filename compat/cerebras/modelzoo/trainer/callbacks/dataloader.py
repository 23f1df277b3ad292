"""Saves and restores the position of a restartable training dataloader in checkpoints."""

from __future__ import annotations

from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback


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
                strict=not trainer.checkpoint.disable_strict_checkpoint_loading)
            trainer.logger.info("Dataloader state found in checkpoint and loaded successfully.")
        else:
            trainer.logger.info("The checkpoint has no dataloader state; the dataloader starts "
                                "from the beginning.")


