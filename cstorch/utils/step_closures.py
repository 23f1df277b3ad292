"""Step closures: code that needs tensor *values*, run after the step that produced them.

Inside a traced step tensors have no values. A function decorated with ``@step_closure`` and
called from the step is queued with its arguments and run once the step has finished (after
the body of the user's executor loop), receiving plain torch tensors holding the values of
its own step. ``@checkpoint_closure`` functions run only on the executor's checkpoint steps.
"""

from __future__ import annotations

import functools

from cstorch.backend import current_backend_impl, run_hooks


class RepeatStepClosure:
    """Context kept for API compatibility: on this backend every compiled step re-queues the
    closures it recorded, so closures always repeat on every step."""

    default = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class StepClosureContext:
    step_closure_stack: list = []


def step_closure(closure):
    """Queues ``closure(*args, **kwargs)`` to run after the current step. Returns None."""

    @functools.wraps(closure)
    def wrapper(*args, **kwargs):
        impl = current_backend_impl(raise_exception=False)
        if impl is None:
            closure(*args, **kwargs)
            return None
        impl.add_step_closure("step", named(closure), args, kwargs)
        return None

    wrapper.is_step_closure = True
    return wrapper


def checkpoint_closure(closure):
    """Queues ``closure`` to run after the step only if it is a checkpoint step."""

    @functools.wraps(closure)
    def wrapper(*args, **kwargs):
        impl = current_backend_impl()
        impl.add_step_closure("checkpoint", named(closure), args, kwargs)
        return None

    wrapper.is_step_closure = True
    return wrapper


def named(closure):
    @functools.wraps(closure)
    def run(*args, **kwargs):
        run_hooks.closure_running(closure, args, kwargs)
        StepClosureContext.step_closure_stack.append(closure.__name__)
        try:
            return closure(*args, **kwargs)
        finally:
            StepClosureContext.step_closure_stack.pop()

    return run
