"""The backend's queue of step and checkpoint closures.

A closure called in a traced step's body is recorded with the trace (``TraceScope``); each run
of the compiled step queues it with that step's values, and it runs after the step: by the
``DataExecutor`` after each batch, or at once for a step called outside one
(``run_closures_of_a_step_outside_executor``). A checkpoint closure runs only on the
executor's checkpoint steps, after the state is brought back to the torch objects. In a
multi-process job closures run on process 0, after every process has fetched their values.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import torch

from cstorch.backend import run_hooks
from cstorch.distributed import runtime
from jax_backend import LazyTensor
from jax_backend.errors import CstorchRuntimeError


@dataclasses.dataclass
class QueuedClosure:
    kind: str  # "step" or "checkpoint"
    fn: Callable
    args: tuple
    kwargs: dict


class ClosureQueue:
    """The closures of one backend (``backend``: its facade, whose executors, device state
    and ``fetch_closure_values`` the closures need)."""

    def __init__(self, backend):
        self._backend = backend
        self.queued: list[QueuedClosure] = []
        self._steps_running = 0  # traced steps being called (their closures wait for the end)

    @contextlib.contextmanager
    def running_step(self):
        """While a traced step is called: the closures it calls are queued, to run after it
        (by its DataExecutor, or by ``run_closures_of_a_step_outside_executor``)."""
        self._steps_running += 1
        try:
            yield
        finally:
            self._steps_running -= 1

    def add(self, kind: str, fn, args, kwargs) -> None:
        backend = self._backend
        if backend.trace.record(QueuedClosure(kind, fn, args, kwargs)):
            return
        if not backend.executors.stack and not self._steps_running:
            # Called from the user's loop with no DataExecutor to run it later: run it now,
            # after the values of the steps before it are ready (2.10 queues it until an
            # executor starts, i.e. often never: a deliberate difference).
            self._run([QueuedClosure(kind, fn, args, kwargs)], scheduled=False)
            return
        args = torch.utils._pytree.tree_map(self._snapshot, args)
        kwargs = torch.utils._pytree.tree_map(self._snapshot, kwargs)
        self.queued.append(QueuedClosure(kind, fn, args, kwargs))

    def _snapshot(self, value):
        """A closure argument's value at call time (the device value for stale state)."""
        if not isinstance(value, torch.Tensor) or isinstance(value, LazyTensor):
            return value
        device_state = self._backend.device_state
        if device_state.is_stale(value):
            return LazyTensor(device_state.snapshot(value))
        return value.detach().clone()

    def run_queued(self) -> None:
        """Runs the queued closures, on process 0 only in a multi-process job (as on a
        cluster's user node). Every process fetches their arguments and, for checkpoint
        closures, the state first: gathering values split across processes is a collective."""
        queued, self.queued = self.queued, []
        self._run(queued)

    def run_closures_of_a_step_outside_executor(self, first: int) -> None:
        """A traced step called outside a DataExecutor: the closures it queued (from index
        ``first`` of the queue) run now, with its values, so that what the step prints appears
        after the step, as in eager torch. cerebras-pytorch 2.10 keeps them queued until a
        DataExecutor starts, i.e. often never (a deliberate difference). A checkpoint closure
        has no checkpoint schedule outside an executor: it raises, as 2.10 does when such a
        closure is finally run. (Closures called outside any step and executor run when
        they are called, see ``add``: none wait from before the step.)"""
        in_executor = bool(self._backend.executors.stack)
        if not in_executor:
            run_hooks.step_ended()  # (in an executor: at the end of its batch)
        if in_executor or len(self.queued) <= first:
            return
        queued = self.queued[first:]
        del self.queued[first:]
        self._run(queued)

    def _run(self, queued: list, scheduled: bool = True) -> None:
        """Runs ``queued``. A checkpoint closure runs on the executor's checkpoint steps when
        ``scheduled``; unscheduled (called from the user's loop outside any executor), it
        runs now."""
        backend = self._backend
        runs_here = runtime.process_index() == 0
        for closure in queued:
            if closure.kind == "checkpoint" and not scheduled:
                backend.materialize_state()
            elif closure.kind == "checkpoint":
                context = backend.executors.run_context
                if context is None:
                    name = getattr(closure.fn, "__name__", "the checkpoint closure")
                    raise CstorchRuntimeError(
                        f"Cannot fetch a checkpoint outside of an execution context: "
                        f"checkpoint closure {name!r} was called from a step that runs "
                        "outside a cstorch DataExecutor, so there are no checkpoint steps to "
                        "run it on. Loop over cstorch.utils.data.DataExecutor(loader, "
                        "num_steps=..., checkpoint_steps=...) and call the step inside the "
                        "loop, or save directly with cstorch.save(model.state_dict(), path)."
                    )
                if not (context.is_pre_initial_step or context.is_checkpoint_step):
                    continue
                backend.materialize_state()
            args = backend.fetch_closure_values(closure.args)
            kwargs = backend.fetch_closure_values(closure.kwargs)
            if runs_here:
                closure.fn(*args, **kwargs)
