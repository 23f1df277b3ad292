"""The Logger base class: where ``trainer.log_metrics`` writes."""

from __future__ import annotations

from abc import ABC, abstractmethod

from cerebras.modelzoo.trainer.callbacks.callback import Callback


class Logger(Callback, ABC):
    """A callback that receives metrics. ``name`` (default: the class name) is what
    ``trainer.log_metrics_dict(..., dest=...)`` selects."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def flush(self):
        """Writes out anything buffered."""

    @abstractmethod
    def log_metrics(self, metrics: dict, step: int):
        """Records ``metrics`` (name -> number or tensor) at global step ``step``."""
