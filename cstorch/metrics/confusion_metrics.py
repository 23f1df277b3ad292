"""Metrics computed from an accumulated confusion matrix: Dice coefficient, mean IoU and
F-beta score."""

from __future__ import annotations

from typing import List, Optional

import torch

from cstorch.metrics._ops import (
    check_same_shape,
    class_mask,
    confusion_matrix,
    confusion_parts,
    divide_no_nan,
)
from cstorch.metrics.metric import Metric
from jax_backend.errors import CstorchValueError


def _mean_over_valid(per_class_num, denominator):
    """Mean of num/den over classes whose (masked) denominator is non-zero; 0 if none is."""
    valid = (denominator != 0).to(torch.float32)
    num_valid = valid.sum()
    ratio = divide_no_nan(
        per_class_num, torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    )
    return torch.where(
        num_valid > 0, ratio.sum() / torch.clamp(num_valid, min=1.0), torch.zeros(())
    )


class _ConfusionMatrixMetric(Metric):
    """Accumulates a weighted ``[num_classes, num_classes]`` confusion matrix."""

    def __init__(self, num_classes: int, ignore_classes=None, name: Optional[str] = None):
        self.num_classes = num_classes
        self.mask = class_mask(num_classes, ignore_classes)
        super().__init__(name=name)

    def reset(self):
        self.register_state("confusion_matrix", torch.zeros((self.num_classes, self.num_classes)))
        self._dtype = None

    def update(self, labels, predictions, weights=None, dtype=None):
        """Adds the batch's (weighted) label/prediction pairs to the confusion matrix."""
        check_same_shape(labels, predictions, weights)
        self.confusion_matrix.add_(confusion_matrix(labels, predictions, self.num_classes, weights))
        self._dtype = dtype

    def _cast(self, value):
        return value if self._dtype is None else value.to(self._dtype)


class DiceCoefficientMetric(_ConfusionMatrixMetric):
    """Mean over classes of 2·TP / (2·TP + FP + FN), over the classes that occur.

    Args:
        num_classes: number of classes (the confusion matrix is num_classes²).
        ignore_classes: class ids left out of the mean.
        name: the metric's name.
    """

    def compute(self) -> torch.Tensor:
        true_pos, predicted, actual = confusion_parts(self.confusion_matrix)
        mask = self.mask
        return self._cast(_mean_over_valid(2 * true_pos * mask, (predicted + actual) * mask))


class MeanIOUMetric(_ConfusionMatrixMetric):
    """Mean over classes of TP / (TP + FP + FN), over the classes that occur.

    Args:
        num_classes: number of classes (the confusion matrix is num_classes²).
        ignore_classes: class ids left out of the mean.
        name: the metric's name.
    """

    def compute(self) -> torch.Tensor:
        true_pos, predicted, actual = confusion_parts(self.confusion_matrix)
        mask = self.mask
        return self._cast(_mean_over_valid(true_pos * mask, (predicted + actual - true_pos) * mask))


class FBetaScoreMetric(_ConfusionMatrixMetric):
    """F-beta = (1+β²)·P·R / (β²·P + R), micro- or macro-averaged over the kept classes.

    Args:
        num_classes: number of classes, at least 2.
        beta: the positive weight of recall against precision.
        average_type: "micro" (pool all classes) or "macro" (mean of per-class scores).
        ignore_labels: class ids left out.
        name: the metric's name.
    """

    def __init__(
        self,
        num_classes,
        beta: float = 1.0,
        average_type: str = "micro",
        ignore_labels: Optional[List] = None,
        name: Optional[str] = None,
    ):
        if num_classes <= 1:
            raise CstorchValueError(f"'num_classes' should be at least 2, got {num_classes}.")
        if beta <= 0:
            raise CstorchValueError(f"'beta' should be a positive number, got {beta}.")
        if average_type not in ("micro", "macro"):
            raise CstorchValueError(
                f"The average_type has to be one of ['micro', 'macro'], got {average_type!r}."
            )
        self.beta = beta
        self.average_type = average_type
        super().__init__(num_classes, ignore_labels, name)

    def update(self, labels, predictions, dtype=None):
        super().update(labels, predictions, None, dtype)

    def compute(self) -> torch.Tensor:
        true_pos, predicted, actual = confusion_parts(self.confusion_matrix)
        mask, beta2 = self.mask, float(self.beta) ** 2

        def fbeta(precision, recall):
            return divide_no_nan((1.0 + beta2) * precision * recall, beta2 * precision + recall)

        if self.average_type == "micro":
            tp = (true_pos * mask).sum()
            score = fbeta(
                divide_no_nan(tp, (predicted * mask).sum()),
                divide_no_nan(tp, (actual * mask).sum()),
            )
        else:
            per_class = fbeta(divide_no_nan(true_pos, predicted), divide_no_nan(true_pos, actual))
            score = (per_class * mask).sum() / mask.sum()
        return self._cast(score)
