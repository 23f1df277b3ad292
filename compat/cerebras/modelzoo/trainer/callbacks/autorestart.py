"""The autorestart slot of the Trainer (restarting a failed run is not implemented here)."""

from __future__ import annotations

import warnings

from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback


class AutoRestart(CoreCallback):
    """``AutoRestart(max_num_restarts=None)``. Restarting a failed run needs a supervising
    process (the Model Zoo's RestartableTrainer), which this implementation does not have: a
    non-zero ``max_num_restarts`` warns and runs once."""

    def __init__(self, max_num_restarts=None, min_steps_since_last_ckpt=None):
        if max_num_restarts is not None and (
            isinstance(max_num_restarts, bool)
            or not isinstance(max_num_restarts, int)
            or max_num_restarts < 0
        ):
            raise ValueError(
                f"max_num_restarts must be a non-negative integer or None, got "
                f"{max_num_restarts!r}."
            )
        self.max_num_restarts = max_num_restarts
        self.min_steps_since_last_ckpt = min_steps_since_last_ckpt

    @property
    def enabled(self) -> bool:
        return False

    def pre_setup(self, trainer):
        if self.max_num_restarts:
            warnings.warn(
                "Autorestart is not implemented on this engine; the run will not be "
                "restarted if it fails.",
                stacklevel=2,
            )
