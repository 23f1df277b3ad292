"""``Metric``: the base class of cstorch metrics, and ``get_all_metrics``.

A metric keeps its running totals in tensors registered with ``register_state`` (non-persistent
buffers by default). ``update`` changes them in place with torch ops, so calling a metric inside
a ``@cstorch.trace`` step compiles the update into the step: the totals are backend state,
carried on the device between steps like parameters. ``compute`` reads them:

* inside a traced step it is traced like any other op and its value is a step output;
* outside a step it runs eagerly on the totals (brought up to date from the device first) and
  caches its result until the totals change.

Differences from cerebras-pytorch 2.10, on purpose:

* The compute cache is keyed by the state it was computed from, not cleared by ``update``
  alone: a compiled step updates the totals without running Python, so a cache that only
  ``update`` cleared would go stale. A value computed inside a trace is never cached (it is a
  traced tensor), so no traced tensor outlives the trace in a Python attribute.
* ``num_updates`` counts steps: inside a traced step the increment is a step closure, so it
  runs after every execution of the compiled step, not only when it is traced.
* ``register_state`` of a name that already holds a tensor of the same shape and dtype copies
  the new value in place (``reset`` keeps the tensor's identity, which is how the backend
  tracks state); anything else registers a new buffer as ``register_buffer`` does.
"""

from __future__ import annotations

import abc
import functools
import weakref
from collections import defaultdict
from typing import Any

import torch

from cstorch import config
from cstorch.backend import current_backend_impl, use_cs
from jax_backend.errors import CstorchRuntimeError

_NOT_STATE_MESSAGE = (
    "Metric {name!r} was updated inside a traced step, but its state is not backend state: "
    "the metric was created before the backend existed (or inside a traced step), so its "
    "totals could not persist between steps. Create metrics after `cstorch.backend(...)` / "
    "`cstorch.compile(...)`, or make the metric a submodule of the compiled model."
)


def _tracing_impl():
    """The backend implementation if one exists, and whether it is tracing a step now."""
    impl = current_backend_impl(raise_exception=False)
    return impl, impl is not None and impl.is_tracing


def is_tracing() -> bool:
    """True while a ``@cstorch.trace`` step is being captured (tensors have no values)."""
    return _tracing_impl()[1]


def host_float(value: torch.Tensor):
    """``float(value)`` outside a trace; inside one the 0-dim tensor itself (no value yet)."""
    return value if is_tracing() else float(value)


class Metric(torch.nn.Module, abc.ABC):
    """Base class of metrics: subclasses implement ``reset``, ``update`` and ``compute``.

    Args:
        name: the metric's name (need not be unique; see ``get_all_metrics``).
    """

    registry = defaultdict(list)  # name -> every metric ever created with that name

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self._num_updates = 0
        self._traced_updates = 0  # updates recorded by the trace in progress
        self._cache = None  # (state token, value) of the last eager compute
        self._backend_ref = None  # weakref to the backend implementation holding our state
        self.registry[name].append(self)
        self._wrap_methods()
        self.reset()
        self.register_state_dict_pre_hook(lambda *_: self._pull_from_device())
        self.register_load_state_dict_pre_hook(lambda *_: self._pull_from_device())
        impl, tracing = _tracing_impl()
        if impl is not None and not tracing:
            self._attach(impl)

    # ------------------------------------------------------------------ API
    @property
    def num_updates(self) -> int:
        """How many times the metric was updated since the last ``reset``."""
        return self._num_updates

    @abc.abstractmethod
    def reset(self) -> None:
        """(Re)initializes the state, typically with ``register_state``."""

    @abc.abstractmethod
    def update(self, *args, **kwargs) -> None:
        """Accumulates one batch into the state (in place, with torch ops only)."""

    @abc.abstractmethod
    def compute(self) -> Any:
        """The metric value computed from the state."""

    def register_state(self, name: str, tensor: torch.Tensor, persistent: bool = False) -> None:
        """Registers ``tensor`` as state ``name`` (a buffer; in ``state_dict`` only if
        ``persistent``)."""
        existing = self._buffers.get(name)
        if (
            existing is not None
            and isinstance(tensor, torch.Tensor)
            and existing.shape == tensor.shape
            and existing.dtype == tensor.dtype
        ):
            with torch.no_grad():
                existing.copy_(tensor)
            if persistent:
                self._non_persistent_buffers_set.discard(name)
            else:
                self._non_persistent_buffers_set.add(name)
            return
        self.register_buffer(name, tensor, persistent=persistent)

    def forward(self, *args, **kwargs) -> Any:
        """``update(*args, **kwargs)``, then returns ``compute()``."""
        self.update(*args, **kwargs)
        return self.compute()

    def __float__(self) -> float:
        return float(self.compute())

    # ------------------------------------------------------------------ backend state
    def _state_tensors(self) -> list:
        return [b for module in self.modules() for b in module._buffers.values() if b is not None]

    def _cstorch_state_slots(self) -> list:
        from jax_backend import Slot

        return [
            Slot(module._buffers, key)
            for module in self.modules()
            for key, b in module._buffers.items()
            if b is not None
        ]

    def _attached_impl(self):
        return self._backend_ref() if self._backend_ref is not None else None

    def _attach(self, impl) -> None:
        impl.register_metric(self)
        self._backend_ref = weakref.ref(impl)

    def _is_backend_state(self, impl) -> bool:
        return self._attached_impl() is impl or any(
            self is m for model in impl.models for m in model.modules()
        )

    def _pull_from_device(self) -> None:
        """Copies newer device values of the state into the torch tensors."""
        impl = current_backend_impl(raise_exception=False)
        if impl is not None and not impl.is_tracing:
            impl.device_state.materialize(self._state_tensors())

    def _state_token(self) -> tuple:
        return tuple((t, t._version) for t in self._state_tensors())

    def _cache_matches(self, token) -> bool:
        if self._cache is None or len(self._cache[0]) != len(token):
            return False
        return all(a is b and va == vb for (a, va), (b, vb) in zip(self._cache[0], token))

    def _count_update(self) -> None:
        self._num_updates += 1

    def _forget_traced_updates(self) -> None:
        self._traced_updates = 0

    # ------------------------------------------------------------------ wrapping
    def _wrap_methods(self) -> None:
        reset, update, compute = self.reset, self.update, self.compute

        @functools.wraps(reset)
        def wrapped_reset(*args, **kwargs):
            self._pull_from_device()
            result = reset(*args, **kwargs)
            self._num_updates = 0
            self._cache = None
            return result

        @functools.wraps(update)
        def wrapped_update(*args, **kwargs):
            impl, tracing = _tracing_impl()
            if impl is not None:
                if tracing and not self._is_backend_state(impl):
                    raise CstorchRuntimeError(_NOT_STATE_MESSAGE.format(name=self.name))
                if not tracing:
                    if self._attached_impl() is not impl:
                        self._attach(impl)
                    self._pull_from_device()
            self._cache = None
            result = update(*args, **kwargs)
            if tracing:
                if not self._traced_updates:
                    impl.at_trace_exit(self._forget_traced_updates)
                self._traced_updates += 1
                impl.add_step_closure("step", self._count_update, (), {})
            else:
                self._num_updates += 1
            return result

        @functools.wraps(compute)
        def wrapped_compute():
            impl, tracing = _tracing_impl()
            if use_cs() and self._num_updates + self._traced_updates == 0:
                raise CstorchRuntimeError(
                    f"Trying to compute metric {self.name!r}, but the metric has not been "
                    "updated. This is not supported when running on CSX; call the metric (or "
                    "its update) before computing it."
                )
            if tracing:
                return compute()  # a traced value: never cached
            self._pull_from_device()
            token = self._state_token()
            if self._cache_matches(token):
                return self._cache[1]
            value = compute()
            self._cache = (token, value)
            return value

        self.reset, self.update, self.compute = wrapped_reset, wrapped_update, wrapped_compute


config.config.on_reset(Metric.registry.clear)  # metrics of models an earlier run built


def step_closures(metric: Metric) -> dict:
    """``{name: closure}``: the step closures a traced ``update`` of ``metric`` records,
    by a stable public name (a cached step's closures are stored by it, and found again
    here)."""
    return {"count update": metric._count_update}


def get_all_metrics():
    """Yields ``(name, metric)`` for every metric created; names shared by several metrics get
    a ``.0``, ``.1``, ... suffix in creation order."""
    for name, metrics in Metric.registry.items():
        for i, metric in enumerate(metrics):
            yield (f"{name}.{i}" if len(metrics) > 1 else name), metric


def compute_all_metrics() -> dict:
    """``{name: value}`` of every metric created (names as ``get_all_metrics``): the 2.0/2.1
    helper their Model Zoo logs evaluation metrics with after an eval run."""
    return {name: metric.compute() for name, metric in get_all_metrics()}
