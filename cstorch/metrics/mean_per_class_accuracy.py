"""``MeanPerClassAccuracyMetric``: accuracy per label class, averaged over classes."""

from __future__ import annotations

from typing import Optional

import torch

from cstorch.metrics._ops import check_same_shape, divide_no_nan
from cstorch.metrics.metric import Metric


class MeanPerClassAccuracyMetric(Metric):
    """Mean over all classes of correct/labels for that class (0 for classes never seen).

    Args:
        num_classes: number of classes.
        name: the metric's name.
    """

    def __init__(self, num_classes, name: Optional[str] = None):
        self.num_classes = num_classes
        super().__init__(name=name)

    def reset(self):
        self.register_state("total_per_class_correct_predictions", torch.zeros(self.num_classes))
        self.register_state("total_per_class_tokens", torch.zeros(self.num_classes))
        self._dtype = None

    def update(self, labels, predictions, weights=None, dtype=None):
        """Accumulates per-class (weighted) correct predictions and label counts."""
        check_same_shape(labels, predictions, weights)
        labels = labels.reshape(-1).to(torch.long)
        correct = (labels == predictions.reshape(-1)).to(torch.float32)
        tokens = torch.ones(labels.shape, dtype=torch.float32)
        if weights is not None:
            weights = weights.reshape(-1).to(torch.float32)
            correct, tokens = correct * weights, tokens * weights
        zeros = torch.zeros(self.num_classes)
        self.total_per_class_correct_predictions.add_(zeros.scatter_add(0, labels, correct))
        self.total_per_class_tokens.add_(zeros.scatter_add(0, labels, tokens))
        self._dtype = dtype

    def compute(self) -> torch.Tensor:
        result = divide_no_nan(
            self.total_per_class_correct_predictions, self.total_per_class_tokens
        ).mean()
        return result if self._dtype is None else result.to(self._dtype)
