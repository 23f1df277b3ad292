"""Seeds torch's generator, which also seeds the compiled steps' randomness on this engine."""

from __future__ import annotations

import torch

from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback


class Reproducibility(CoreCallback):
    """``Reproducibility(seed)``: ``torch.manual_seed(seed)`` before the model is built."""

    def __init__(self, seed=None):
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"seed must be an int or None, got {seed!r}.")
        self.seed = seed

    def pre_setup(self, trainer):
        if self.seed is not None:
            torch.manual_seed(self.seed)
