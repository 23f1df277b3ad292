"""Evaluation metrics that accumulate inside compiled steps (see ``metric.py``).

cerebras-pytorch 2.10 lists a ``compute_all_metrics`` in ``__all__`` that does not exist, so
``from cerebras.pytorch.metrics import *`` raises AttributeError there. It is left out here so
that the star import works; ``get_all_metrics()`` is the helper that exists.
"""

from cstorch.metrics.accuracy import AccuracyMetric
from cstorch.metrics.auc import AUCMetric
from cstorch.metrics.confusion_metrics import DiceCoefficientMetric
from cstorch.metrics.confusion_metrics import FBetaScoreMetric
from cstorch.metrics.confusion_metrics import MeanIOUMetric
from cstorch.metrics.mean import MeanMetric
from cstorch.metrics.mean_per_class_accuracy import MeanPerClassAccuracyMetric
from cstorch.metrics.metric import Metric
from cstorch.metrics.metric import get_all_metrics
from cstorch.metrics.perplexity import PerplexityMetric
from cstorch.metrics.at_k import PrecisionAtKMetric
from cstorch.metrics.at_k import RecallAtKMetric

__all__ = [
    "AccuracyMetric", "AUCMetric", "DiceCoefficientMetric", "MeanMetric", "MeanIOUMetric",
    "MeanPerClassAccuracyMetric", "Metric", "PerplexityMetric", "PrecisionAtKMetric",
    "RecallAtKMetric", "FBetaScoreMetric", "get_all_metrics",
]
