"""1.8/1.9 ``cstorch.metrics``: the metric classes with their 1.x signature
``Metric(name, compute_on_system=...)``.

``compute_on_system`` chose, on a Cerebras system, whether the running totals were kept on
the wafer or computed on the host from fetched outputs. Here every metric accumulates inside
the compiled step (the "on system" way); both settings give the same numbers, so the flag is
accepted and recorded only.
"""

from __future__ import annotations

import cstorch.metrics as _metrics
from cstorch.metrics import Metric, get_all_metrics

__all__ = ["Metric", "compute_all_metrics", "reset_all_metrics", "get_all_metrics"]


def _legacy(cls):
    def __init__(self, name: str, *args, compute_on_system: bool = True, **kwargs):
        self.compute_on_system = bool(compute_on_system)
        cls.__init__(self, name, *args, **kwargs)

    legacy = type(
        cls.__name__,
        (cls,),
        {
            "__init__": __init__,
            "__module__": __name__,
            "__doc__": f"{cls.__doc__}\n\n1.x signature: ``{cls.__name__}(name, ..., "
            "compute_on_system=True)``.",
        },
    )
    return legacy


for _name in _metrics.__all__:
    _cls = getattr(_metrics, _name)
    if isinstance(_cls, type) and issubclass(_cls, Metric) and _cls is not Metric:
        globals()[_name] = _legacy(_cls)
        __all__.append(_name)


class MetricValues(dict):
    """``{name: value}`` of every metric, read as both releases read it: 1.9 calls
    ``.items()``, 1.8 iterates it directly for ``(name, value)`` pairs (so iteration yields
    pairs here; ``keys()``, ``dict(...)`` and indexing are a dict's)."""

    def __iter__(self):
        return iter(self.items())


def compute_all_metrics() -> MetricValues:
    """The value of every metric by name (see ``MetricValues``)."""
    values = MetricValues()
    for name, metric in get_all_metrics():
        value = metric.compute()
        if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
            value = value.item()
        values[name] = value
    return values


def reset_all_metrics():
    for _, metric in get_all_metrics():
        metric.reset()
