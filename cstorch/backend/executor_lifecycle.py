"""The data executors running on a backend, and what the backend does at their run's and
batch's boundaries.

A ``DataExecutor`` pushes itself on ``stack`` for its run (nested executors stack); at the
run's start sparsity masks are initialised and closures queued before it run, after each
batch the step's closures run, and at the run's end the torch tensors that could be read
without asking the device state are brought up to date. The stage tracker (written as each
executor's ``track.json``), the count of programs compiled and the last step's outputs (the
progress display's loss) are the executors' too.
"""

from __future__ import annotations

from cstorch.utils.stage_tracker import StageTracker
from jax_backend.errors import CstorchRuntimeError


class ExecutorLifecycle:
    """The executor side of one backend (``backend``: its facade)."""

    def __init__(self, backend):
        self._backend = backend
        self.stack: list = []  # the running data executors, innermost last
        self.appliance_tracker = StageTracker()  # written as each executor's track.json
        self.appliance_tracker.start("Initialization")
        self.compilations = 0  # programs compiled (progress says whether a run's first did)
        self.last_step_outputs = None  # of the executor's current step: its progress's loss

    @property
    def current(self):
        if not self.stack:
            raise CstorchRuntimeError(
                "Detected that a data executor was not used. Iterate over a "
                "cstorch.utils.data.DataExecutor to run steps."
            )
        return self.stack[-1]

    @property
    def run_context(self):
        return self.current.run_context if self.stack else None

    def compiled(self) -> None:
        """A traced step compiled a program."""
        self.compilations += 1

    def step_returned(self, outputs) -> None:
        """A step returned ``outputs``: inside an executor, its progress display shows the
        loss among them."""
        if self.stack:
            self.last_step_outputs = outputs

    # ------------------------------------------------------------------ boundaries
    def on_run_start(self) -> None:
        self._backend.registry.initialize_sparsity()
        self._backend.run_step_closures()

    def on_run_end(self) -> None:
        """Brings up to date only the torch tensors something could read without asking the
        device state first: released ones (the large parameters and optimizer state that
        nothing else holds) are filled by their guard on first access, so copying them here
        would move every byte of the model to the host at each run's end for nothing."""
        backend = self._backend
        state = backend.device_state
        if state.has_pending:
            state.materialize([t for t in backend.state_view().tensors if not state.is_released(t)])

    def on_batch_end(self) -> None:
        self._backend.run_step_closures()
