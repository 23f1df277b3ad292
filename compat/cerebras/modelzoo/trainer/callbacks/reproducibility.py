"""Seeds torch's generator, which also seeds the compiled steps' randomness on this engine."""

from __future__ import annotations

import torch

from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback

# torch.manual_seed takes a signed or an unsigned 64-bit integer.
SEED_RANGE = (-(2**63), 2**64 - 1)


def check_seed(seed, label: str = "seed") -> None:
    """A seed torch.manual_seed accepts (or None); ValueError naming ``label`` and the range
    otherwise (torch itself says only "Overflow when unpacking long long")."""
    if seed is None:
        return
    if (
        not isinstance(seed, int)
        or isinstance(seed, bool)
        or not (SEED_RANGE[0] <= seed <= SEED_RANGE[1])
    ):
        raise ValueError(
            f"{label}: must be an integer from -2**63 to 2**64 - 1 (the range of "
            f"torch.manual_seed), got {seed!r}"
        )


class Reproducibility(CoreCallback):
    """``Reproducibility(seed)``: ``torch.manual_seed(seed)`` before the model is built."""

    def __init__(self, seed=None):
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"seed must be an int or None, got {seed!r}.")
        check_seed(seed)
        self.seed = seed

    def pre_setup(self, trainer):
        if self.seed is not None:
            torch.manual_seed(self.seed)
