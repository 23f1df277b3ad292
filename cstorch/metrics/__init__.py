"""Evaluation metrics that accumulate inside compiled steps (see ``metric.py``).

cerebras-pytorch 2.10 lists a ``compute_all_metrics`` in ``__all__`` that does not exist, so
``from cerebras.pytorch.metrics import *`` raises AttributeError there. Here it exists (the
2.0/2.1 helper, ``{name: value}`` of every metric, which their Model Zoo calls after an eval
run) but stays out of ``__all__`` as in 2.10's working names; ``get_all_metrics()`` yields the
metric objects.
"""

from cstorch.metrics.accuracy import AccuracyMetric
from cstorch.metrics.at_k import PrecisionAtKMetric, RecallAtKMetric
from cstorch.metrics.auc import AUCMetric
from cstorch.metrics.confusion_metrics import DiceCoefficientMetric, FBetaScoreMetric, MeanIOUMetric
from cstorch.metrics.mean import MeanMetric
from cstorch.metrics.mean_per_class_accuracy import MeanPerClassAccuracyMetric
from cstorch.metrics.metric import (
    Metric,
    compute_all_metrics as compute_all_metrics,
    get_all_metrics,
)
from cstorch.metrics.perplexity import PerplexityMetric

__all__ = [
    "AccuracyMetric",
    "AUCMetric",
    "DiceCoefficientMetric",
    "MeanMetric",
    "MeanIOUMetric",
    "MeanPerClassAccuracyMetric",
    "Metric",
    "PerplexityMetric",
    "PrecisionAtKMetric",
    "RecallAtKMetric",
    "FBetaScoreMetric",
    "get_all_metrics",
]
