"""``PrecisionAtKMetric`` and ``RecallAtKMetric``: how the top-k predicted classes overlap the
true labels of each sample."""

from __future__ import annotations

from typing import Optional

import torch

from cstorch.backend import use_cs
from cstorch.metrics.metric import Metric, host_float
from jax_backend.errors import CstorchNotImplementedError, CstorchValueError


def _hits_per_row(labels, predictions, k):
    """For each sample, how many of its labels are among its k highest-scoring classes."""
    _, top_k = torch.topk(predictions, k, dim=-1)
    return (labels.unsqueeze(-1) == top_k.unsqueeze(-2)).to(torch.float32).sum((-1, -2))


def _check_weights(labels, weights):
    if weights is not None and weights.dim() != 0 and weights.numel() != labels.shape[0]:
        raise CstorchValueError(
            f"`labels` has shape {tuple(labels.shape)} and `weights` {tuple(weights.shape)}: "
            f"`weights` must be a scalar or a vector of size {labels.shape[0]} (one per sample)."
        )


class _AtKMetric(Metric):
    _other = ""  # the name of the second counter

    def __init__(self, k, name: Optional[str] = None):
        if use_cs():
            raise CstorchNotImplementedError(f"{type(self).__name__} is not supported on CSX yet.")
        self.k = k
        super().__init__(name=name)

    def reset(self):
        self.register_state("true_positive_at_k", torch.tensor(0.0))
        self.register_state(self._other, torch.tensor(0.0))

    def _misses(self, labels, hits):
        raise NotImplementedError

    def update(self, labels, predictions, weights=None):
        """``labels``: (batch, num_labels) class ids; ``predictions``: (batch, num_classes)
        scores; ``weights``: a scalar or one per sample."""
        _check_weights(labels, weights)
        hits = _hits_per_row(labels, predictions, self.k)
        misses = self._misses(labels, hits)
        if weights is not None:
            hits, misses = hits * weights, misses * weights
        self.true_positive_at_k.add_(hits.sum())
        getattr(self, self._other).add_(misses.sum())

    def compute(self):
        true_pos = self.true_positive_at_k
        return host_float(true_pos / (true_pos + getattr(self, self._other)))


class PrecisionAtKMetric(_AtKMetric):
    """TP@k / (TP@k + FP@k), where a sample's FP@k counts its top-k classes that are not labels.

    ``compute()`` returns a Python float (a 0-dim tensor inside a traced step).

    Args:
        k: how many top predictions count.
        name: the metric's name.
    """

    _other = "false_positive_at_k"

    def _misses(self, labels, hits):
        return self.k - hits


class RecallAtKMetric(_AtKMetric):
    """TP@k / (TP@k + FN@k), where a sample's FN@k counts its labels missing from its top-k.

    ``compute()`` returns a Python float (a 0-dim tensor inside a traced step).

    Args:
        k: how many top predictions count.
        name: the metric's name.
    """

    _other = "false_negative_at_k"

    def _misses(self, labels, hits):
        return labels.shape[-1] - hits
