"""``PerplexityMetric``: exp of the mean loss per token."""

from __future__ import annotations

import torch

from cstorch.metrics.metric import Metric


class PerplexityMetric(Metric):
    """exp(Σ loss / Σ tokens), where ``loss`` is the loss *summed* over a batch's tokens.

    Args:
        name: the metric's name.
    """

    def reset(self):
        self.register_state("total_loss", torch.tensor(0.0))
        self.register_state("total_num_tokens", torch.tensor(0.0))
        self._dtype = None

    def update(self, labels, loss, weights=None, dtype=None):
        """Adds ``loss`` and the batch's token count (labels, or positive weights)."""
        if weights is None:
            num_tokens = torch.full((), float(labels.numel()))
        else:
            num_tokens = (weights > 0).to(torch.float32).sum()
        self.total_loss.add_(loss)
        self.total_num_tokens.add_(num_tokens)
        self._dtype = dtype

    def compute(self) -> torch.Tensor:
        result = torch.exp(self.total_loss / self.total_num_tokens)
        return result if self._dtype is None else result.to(self._dtype)
