"""Finding the loss among a model's outputs, as 1.x's ``cbtorch.utils.extract_loss`` did."""

from __future__ import annotations

import torch


def extract_loss(outputs):
    """The loss among a forward's outputs (the tensor, ``outputs["loss"]`` or the first of a
    tuple/list)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, dict) and "loss" in outputs:
        return outputs["loss"]
    if isinstance(outputs, (list, tuple)) and outputs:
        return outputs[0]
    raise TypeError(
        f"Could not find the loss in the model's outputs "
        f"({type(outputs).__name__}): return a tensor, a dict with a 'loss' entry, "
        "or a tuple whose first element is the loss."
    )
