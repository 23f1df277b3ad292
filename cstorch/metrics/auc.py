"""``AUCMetric``: area under the ROC or precision-recall curve of a binary classifier,
approximated by a Riemann sum over fixed thresholds."""

from __future__ import annotations

from typing import Optional

import torch

from cstorch.backend import use_cs
from cstorch.metrics._ops import check_same_shape, divide_no_nan
from cstorch.metrics.metric import Metric, host_float, is_tracing
from jax_backend.errors import CstorchNotImplementedError, CstorchValueError

_CURVES = ("ROC", "PR")
_SUMMATIONS = ("interpolation", "minoring", "majoring")
_EPSILON = 1e-7


class AUCMetric(Metric):
    """Counts TP/FP/FN/TN at each threshold, then integrates the curve.

    ``compute()`` returns a Python float (a 0-dim tensor inside a traced step).

    Args:
        num_thresholds: how many thresholds, evenly spaced over [0, 1] (at least 2).
        curve: "ROC" (true-positive rate over false-positive rate) or "PR" (precision over
            recall).
        name: the metric's name.
        summation_method: "interpolation" (trapezoids; for PR the interpolation of Davis &
            Goadrich 2006), "minoring" (lower bound) or "majoring" (upper bound).
        thresholds: explicit thresholds in [0, 1], used instead of ``num_thresholds``.
    """

    def __init__(
        self,
        num_thresholds=200,
        curve="ROC",
        name: Optional[str] = None,
        summation_method="interpolation",
        thresholds=None,
    ):
        if use_cs():
            raise CstorchNotImplementedError("AUCMetric is not supported on CSX yet.")
        if curve not in _CURVES:
            raise CstorchValueError(f"Curve must be either ROC or PR. Curve {curve!r} is unknown.")
        if summation_method not in _SUMMATIONS:
            raise CstorchValueError(
                f"Invalid AUC summation method value: {summation_method!r}. Expected one of "
                f"{list(_SUMMATIONS)}."
            )
        if thresholds is not None:
            inner = sorted(float(t) for t in thresholds)
        else:
            if num_thresholds <= 1:
                raise CstorchValueError(f"num_thresholds must be > 1, got {num_thresholds}.")
            inner = [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        self.curve = curve
        self.summation_method = summation_method
        self.num_thresholds = len(inner) + 2
        # End points just outside [0, 1] so that predictions of exactly 0 or 1 are counted.
        self.thresholds = torch.tensor(
            [-_EPSILON] + inner + [1.0 + _EPSILON], dtype=torch.float32
        ).reshape(-1, 1)
        super().__init__(name=name)

    def reset(self):
        for state in ("true_positive", "true_negative", "false_positive", "false_negative"):
            self.register_state(state, torch.zeros(self.num_thresholds))

    def update(self, labels, predictions, weights=None):
        """``labels`` (> 0 is positive) and ``predictions`` in [0, 1], of the same shape."""
        check_same_shape(labels, predictions, weights)
        labels, predictions = labels.reshape(-1), predictions.reshape(-1)
        if not is_tracing() and labels.numel():
            if bool(labels.min() < 0):
                raise CstorchValueError("Negative values in `labels` are not allowed.")
            if bool(predictions.min() < 0) or bool(predictions.max() > 1):
                raise CstorchValueError("Values in `predictions` must lie in [0, 1].")
        pred_pos = predictions.unsqueeze(0) > self.thresholds  # (thresholds, samples)
        label_pos = (labels > 0).unsqueeze(0)
        w = None if weights is None else weights.reshape(-1).to(torch.float32)

        def count(mask):
            mask = mask.to(torch.float32)
            return (mask if w is None else mask * w).sum(-1)

        self.true_positive.add_(count(label_pos & pred_pos))
        self.false_positive.add_(count(~label_pos & pred_pos))
        self.false_negative.add_(count(label_pos & ~pred_pos))
        self.true_negative.add_(count(~label_pos & ~pred_pos))

    def _interpolated_pr_auc(self):
        """Precision integrated over recall with TP and TP+FP linear between thresholds."""
        tp, fp, fn = self.true_positive, self.false_positive, self.false_negative
        d_tp = tp[:-1] - tp[1:]
        p = tp + fp
        d_p = p[:-1] - p[1:]
        slope = divide_no_nan(d_tp, torch.clamp(d_p, min=0))
        intercept = tp[1:] - slope * p[1:]
        both_positive = (p[:-1] > 0) & (p[1:] > 0)
        ratio = torch.where(
            both_positive, divide_no_nan(p[:-1], torch.clamp(p[1:], min=0)), torch.ones_like(p[1:])
        )
        increments = divide_no_nan(
            slope * (d_tp + intercept * torch.log(ratio)), torch.clamp(tp[1:] + fn[1:], min=0)
        )
        return increments.sum()

    def compute(self):
        if self.curve == "PR" and self.summation_method == "interpolation":
            return host_float(self._interpolated_pr_auc())
        tp, fp = self.true_positive, self.false_positive
        recall = divide_no_nan(tp, tp + self.false_negative)
        if self.curve == "ROC":
            x, y = divide_no_nan(fp, fp + self.true_negative), recall
        else:
            x, y = recall, divide_no_nan(tp, tp + fp)
        if self.summation_method == "interpolation":
            heights = (y[:-1] + y[1:]) / 2
        elif self.summation_method == "minoring":
            heights = torch.minimum(y[:-1], y[1:])
        else:
            heights = torch.maximum(y[:-1], y[1:])
        return host_float(((x[:-1] - x[1:]) * heights).sum())
