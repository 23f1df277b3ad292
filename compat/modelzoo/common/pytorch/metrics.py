"""The Model Zoo 1.x metrics (``from modelzoo.common.pytorch.metrics import AccuracyMetric``).

The built-in metrics are cstorch's (their totals accumulate inside the compiled step) with
the 1.x signature ``Metric(name=None, ...)``. ``CBMetric`` is the 1.x base for user metrics:
``update_on_device`` runs inside the step (it is traced) and returns ``DeviceOutputs``,
whose values ``update_on_host`` receives after the step, as on a Cerebras system.
``compute_all_metrics()`` returns ``{name: value}``.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from typing import Any, Dict, List

import cstorch.metrics as _metrics
from cstorch.utils.step_closures import step_closure

_cb_metrics: Dict[str, "CBMetric"] = {}


def _default_name(cls) -> str:
    stem = cls.__name__[: -len("Metric")] if cls.__name__.endswith("Metric") else cls.__name__
    return re.sub(r"(?<!^)(?=[A-Z])", "_", stem).lower()


def _legacy(cls):
    def __init__(self, name: str = None, *args, **kwargs):
        cls.__init__(self, name or _default_name(cls), *args, **kwargs)

    return type(
        cls.__name__, (cls,), {"__init__": __init__, "__module__": __name__, "__doc__": cls.__doc__}
    )


AccuracyMetric = _legacy(_metrics.AccuracyMetric)
AUCMetric = _legacy(_metrics.AUCMetric)
DiceCoefficientMetric = _legacy(_metrics.DiceCoefficientMetric)
FBetaScoreMetric = _legacy(_metrics.FBetaScoreMetric)
MeanIOUMetric = _legacy(_metrics.MeanIOUMetric)
PerplexityMetric = _legacy(_metrics.PerplexityMetric)
PrecisionAtKMetric = _legacy(_metrics.PrecisionAtKMetric)
RecallAtKMetric = _legacy(_metrics.RecallAtKMetric)


@dataclasses.dataclass
class DeviceOutputs:
    """What ``CBMetric.update_on_device`` hands to ``update_on_host``."""

    args: List[Any] = dataclasses.field(default_factory=list)
    kwargs: Dict[str, Any] = dataclasses.field(default_factory=dict)


class CBMetric(abc.ABC):
    """A 1.x metric split into a device part (traced into the step) and a host part (run
    after the step on the device part's values)."""

    def __init__(self, name: str = None):
        base = name or _default_name(type(self))
        self.name, i = base, 1
        while self.name in _cb_metrics:
            self.name, i = f"{base}_{i}", i + 1
        _cb_metrics[self.name] = self
        self.reset()

    def init_state(self):
        """Sets up the host-side state (called by ``reset``)."""

    def reset(self):
        self.init_state()

    @abc.abstractmethod
    def update_on_device(self, *args, **kwargs) -> DeviceOutputs: ...

    @abc.abstractmethod
    def update_on_host(self, *args, **kwargs) -> None: ...

    @abc.abstractmethod
    def compute(self) -> Any: ...

    def __call__(self, *args, **kwargs) -> None:
        outputs = self.update_on_device(*args, **kwargs)
        if not isinstance(outputs, DeviceOutputs):
            raise TypeError(
                f"{type(self).__name__}.update_on_device must return DeviceOutputs, "
                f"got {type(outputs).__name__}."
            )
        step_closure(self.update_on_host)(*outputs.args, **outputs.kwargs)


def get_all_metrics() -> dict:
    """``{name: metric}`` for every metric created in this process."""
    found = dict(_metrics.get_all_metrics())
    found.update(_cb_metrics)
    return found


def compute_all_metrics() -> dict:
    """``{name: value}`` of every metric (single-element tensors become floats)."""
    values = {}
    for name, metric in get_all_metrics().items():
        value = metric.compute()
        if hasattr(value, "numel") and value.numel() == 1:
            value = float(value)
        values[name] = value
    return values


def reset_all_metrics() -> None:
    for metric in get_all_metrics().values():
        metric.reset()
