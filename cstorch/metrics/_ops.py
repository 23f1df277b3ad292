"""Tensor helpers shared by the metrics (plain torch ops, safe inside a traced step)."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from cstorch.metrics.metric import is_tracing
from jax_backend.errors import CstorchValueError


def divide_no_nan(num: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
    """``num / denom`` with 0 where ``denom`` is 0 (as ``tf.math.divide_no_nan``)."""
    zero = denom == 0
    return torch.where(zero, torch.zeros_like(num), num) / torch.where(
        zero, torch.ones_like(denom), denom
    )


def class_mask(num_classes: int, ignore_classes: Optional[Sequence[int]] = None) -> torch.Tensor:
    """A float32 vector of ones with zeros at ``ignore_classes`` (a graph constant)."""
    mask = torch.ones(num_classes, dtype=torch.float32, device="cpu")
    if ignore_classes:
        mask[torch.as_tensor(list(ignore_classes), dtype=torch.long)] = 0.0
    return mask


def check_same_shape(labels, predictions, weights=None) -> None:
    if labels.shape != predictions.shape:
        raise CstorchValueError(
            f"`labels` and `predictions` have mismatched shapes {tuple(labels.shape)} and "
            f"{tuple(predictions.shape)}; pass one prediction per label."
        )
    if weights is not None and weights.shape != labels.shape:
        raise CstorchValueError(
            f"`labels` and `weights` have mismatched shapes {tuple(labels.shape)} and "
            f"{tuple(weights.shape)}; pass one weight per label (0 masks a label out)."
        )


def check_non_negative(name: str, tensor: torch.Tensor) -> None:
    """Raises ValueError for negative entries; skipped inside a trace (no values there)."""
    if not is_tracing() and tensor.numel() and bool(tensor.min() < 0):
        raise CstorchValueError(
            f"Negative values in `{name}` are not allowed (class ids start at 0)."
        )


def confusion_matrix(labels, predictions, num_classes: int, weights=None) -> torch.Tensor:
    """``[num_classes, num_classes]`` float32 counts: rows are labels, columns predictions,
    each pair contributing its weight (1 by default)."""
    labels = labels.reshape(-1).to(torch.long)
    predictions = predictions.reshape(-1).to(torch.long)
    check_non_negative("labels", labels)
    check_non_negative("predictions", predictions)
    if weights is None:
        weights = torch.ones(predictions.shape, dtype=torch.float32)
    else:
        weights = weights.reshape(-1).to(torch.float32)
    counts = torch.zeros(num_classes * num_classes, dtype=torch.float32)
    counts = counts.scatter_add(0, labels * num_classes + predictions, weights)
    return counts.reshape(num_classes, num_classes)


def confusion_parts(matrix: torch.Tensor):
    """(true positives per class, predicted per class, actual per class) of a confusion
    matrix, as float32 vectors."""
    true_pos = (matrix * torch.eye(matrix.shape[0], dtype=matrix.dtype)).sum(-1)
    return true_pos, matrix.sum(0), matrix.sum(1)
