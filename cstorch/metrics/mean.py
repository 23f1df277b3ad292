"""``MeanMetric``: the weighted mean of the values it is given."""

from __future__ import annotations

import torch

from cstorch.metrics.metric import Metric


class MeanMetric(Metric):
    """Σ value·weight / Σ weight over every element seen.

    Args:
        name: the metric's name.
    """

    def reset(self):
        self.register_state("total_value", torch.tensor(0.0))
        self.register_state("total_weight", torch.tensor(0.0))
        self._dtype = None

    def update(self, value, weight=1.0, dtype=None):
        """Accumulates ``value`` (any shape); ``weight`` is broadcast to its shape."""
        value = torch.as_tensor(value, dtype=torch.float32)
        weight = torch.as_tensor(weight, dtype=torch.float32).broadcast_to(value.shape)
        self.total_value.add_((value * weight).sum())
        self.total_weight.add_(weight.sum())
        self._dtype = dtype

    def compute(self) -> torch.Tensor:
        result = self.total_value / self.total_weight
        return result if self._dtype is None else result.to(self._dtype)
