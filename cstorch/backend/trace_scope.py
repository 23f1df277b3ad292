"""The backend while a step body runs under the tracer.

During a capture (``cstorch.core.step_capture``) the step closures the body calls are recorded
rather than queued, only one compiled model may be used, and Python values that hold traced
tensors (a grad scaler's, those of ``at_trace_exit`` callbacks: metrics, the 1.x lazy API) are
dropped when the body returns or raises.
"""

from __future__ import annotations

import contextlib
from typing import Callable

from jax_backend.errors import CstorchRuntimeError


class TraceScope:
    """Whether a step is being traced, and what holds only while it is."""

    def __init__(self, grad_scalers: list):
        self._grad_scalers = grad_scalers  # the registry's (they forget traced values)
        self._recorder = None  # closures recorded while tracing
        self._at_exit: list = []  # callbacks that drop trace-time Python values
        self._models_used = None

    @property
    def is_tracing(self) -> bool:
        return self._recorder is not None

    @contextlib.contextmanager
    def tracing(self, recorder: list):
        """While a step body runs under the tracer: closures are recorded in ``recorder``,
        only one model may be used, and Python values holding traced tensors are dropped on
        the way out, also when the trace fails (grad scalers', and those of
        ``at_trace_exit`` callbacks)."""
        if self._recorder is not None:
            raise CstorchRuntimeError("A traced step cannot trace another step inside it.")
        self._recorder = recorder
        self._models_used = []
        try:
            yield
        finally:
            self._recorder = None
            self._models_used = None
            for scaler in self._grad_scalers:
                scaler._forget_traced_values()
            callbacks, self._at_exit = self._at_exit, []
            for callback in callbacks:
                callback()

    def at_trace_exit(self, callback: Callable[[], None]) -> None:
        """Calls ``callback()`` when the step body being traced returns or raises."""
        if self._recorder is None:
            raise CstorchRuntimeError("at_trace_exit is only available while a step is traced.")
        self._at_exit.append(callback)

    def record(self, closure) -> bool:
        """Records a closure the body called (True), or False when no step is traced."""
        if self._recorder is None:
            return False
        self._recorder.append(closure)
        return True

    def model_used(self, model) -> None:
        """A compiled model's forward in the body: a second model is refused."""
        if self._models_used is None:
            return
        if self._models_used and self._models_used[0] is not model:
            raise CstorchRuntimeError(
                "Detected that more than one compiled model was used in a step function. "
                "Only one compiled model may be used per traced step; combine the models "
                "into one torch.nn.Module and compile that."
            )
        if not self._models_used:
            self._models_used.append(model)
