"""Hooks for tools that watch a script's run without changing it (``python -m
cstorch.parity`` records every closure value by step): public registration points instead of
replacing the backend's methods at run time.

* ``register_model_hook(hook)``: ``hook(model)`` when a model is registered with the backend
  (``cstorch.compile``), before any step uses it.
* ``register_step_end_hook(hook)``: ``hook()`` at the end of every step, before its
  closures run: after each batch of a ``DataExecutor``, and after each traced step called
  outside one.
* ``register_closure_hook(hook)``: ``hook(closure, args, kwargs)`` just before a step or
  checkpoint closure runs, with the values it receives (``closure`` is the user's function).

Each returns a handle whose ``remove()`` unregisters the hook. A leaf module: the backend,
the data executor and the closures all call into it.
"""

from __future__ import annotations

import collections

from torch.utils.hooks import RemovableHandle

# OrderedDicts: RemovableHandle keeps a weak reference to its dict (a plain dict has none).
_model_hooks: dict = collections.OrderedDict()
_step_end_hooks: dict = collections.OrderedDict()
_closure_hooks: dict = collections.OrderedDict()


def _register(hooks: dict, hook) -> RemovableHandle:
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def register_model_hook(hook) -> RemovableHandle:
    """Calls ``hook(model)`` when a model is registered with the backend."""
    return _register(_model_hooks, hook)


def register_step_end_hook(hook) -> RemovableHandle:
    """Calls ``hook()`` at the end of every step, before its closures run."""
    return _register(_step_end_hooks, hook)


def register_closure_hook(hook) -> RemovableHandle:
    """Calls ``hook(closure, args, kwargs)`` before each step or checkpoint closure runs."""
    return _register(_closure_hooks, hook)


def model_registered(model) -> None:
    for hook in list(_model_hooks.values()):
        hook(model)


def step_ended() -> None:
    for hook in list(_step_end_hooks.values()):
        hook()


def closure_running(closure, args, kwargs) -> None:
    for hook in list(_closure_hooks.values()):
        hook(closure, args, kwargs)
