"""``AccuracyMetric``: the fraction of labels the predictions match."""

from __future__ import annotations

import torch

from cstorch.metrics.metric import Metric
from jax_backend.user_frames import warn


class AccuracyMetric(Metric):
    """Σ correct·weight / (number of labels, or number of positive weights).

    Args:
        name: the metric's name.
    """

    def reset(self):
        self.register_state("total_correct_predictions", torch.tensor(0.0))
        self.register_state("total_num_tokens", torch.tensor(0.0))
        self._dtype = None

    def update(self, labels, predictions, weights=None, dtype=None):
        """Accumulates a batch; predictions of another shape are reshaped (with a warning)."""
        if labels.shape != predictions.shape:
            warn(
                f"Shapes mismatch in accuracy metric {self.name!r}: labels "
                f"{tuple(labels.shape)}, predictions {tuple(predictions.shape)}; reshaping the "
                "predictions to the labels' shape."
            )
            predictions = predictions.reshape(labels.shape)
        correct = (labels == predictions).to(torch.float32)
        if weights is None:
            num_tokens = torch.full((), float(correct.numel()))
        else:
            correct = correct * weights
            num_tokens = (weights > 0).to(torch.float32).sum()
        self.total_correct_predictions.add_(correct.sum())
        self.total_num_tokens.add_(num_tokens)
        self._dtype = dtype

    def compute(self) -> torch.Tensor:
        result = self.total_correct_predictions / self.total_num_tokens
        return result if self._dtype is None else result.to(self._dtype)
