"""The data executor's profiler (``executor.profiler.rate_tracker``).

Besides its activities, it drives two things around each executor run: the CSX op profiler
(``cstorch.profiler.profile``) when one is active, and the run's progress display
(``cstorch.utils.progress``: a run header, then a bar on a terminal or a plain line every few
steps elsewhere, with the loss the step returns, the steady-state rate and the time left).
``CSTORCH_PROGRESS`` (auto, bar, lines, off) chooses the display; an executor whose
``show_progress`` is False (the Model Zoo Trainer's, which shows its own) shows none.
"""

from __future__ import annotations

import json
import os
import time

from cstorch import config
from cstorch.utils import progress as _progress
from cstorch.utils.tracker import RateTracker
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError, CstorchValueError
from jax_backend.user_frames import warn

PROGRESS_BAR_MIN_STEPS = config.progress_bar_min_steps.default


class Activity:
    """A thing the profiler measures; subclasses give it a unique ``name()``."""

    @staticmethod
    def name() -> str:
        raise NotImplementedError

    def start(self):
        pass

    def step(self, batch_size):
        pass

    def stop(self):
        pass

    def summary(self) -> dict:
        return {}


class RateTrackerActivity(Activity):
    """Samples per second over the last step (``rate``) and the run (``global_rate``).

    The values are computed once per step, before that step's closures run, so a
    ``@step_closure`` reads the rate of its own step. The first step compiles the program:
    its rate is 0.0 and the clock restarts after it, so ``global_rate`` and ``total_time``
    cover steps 2 onward (``total_samples`` counts every step).
    """

    @staticmethod
    def name() -> str:
        return "rate_tracker"

    def __init__(self):
        self.tracker = RateTracker()
        self.total_samples = 0
        self._steps = 0
        self._rate = None
        self._global_rate = None
        self._total_time = None

    def start(self):
        self.tracker.reset()

    def step(self, batch_size):
        samples = batch_size or 0
        self.total_samples += samples
        if self._steps == 0:
            self.tracker.reset()
            self._rate = self._global_rate = self._total_time = 0.0
        else:
            self.tracker.add(samples)
            self._rate = self.tracker.rate()
            self._total_time = self.tracker.elapsed_seconds()
            self._global_rate = (
                self.tracker.total_count / self._total_time if self._total_time > 0 else 0.0
            )
        self._steps += 1

    @staticmethod
    def _require(value, what):
        if value is None:
            raise CstorchRuntimeError(
                f"The rate tracker has not computed the {what} yet: it is "
                "computed at the end of each step, before step closures run."
            )
        return value

    @property
    def total_time(self) -> float:
        return self._require(self._total_time, "total time")

    @property
    def rate(self) -> float:
        return self._require(self._rate, "rate")

    @property
    def global_rate(self) -> float:
        return self._require(self._global_rate, "global rate")

    @property
    def samples_per_sec(self) -> float:
        return self.global_rate

    @property
    def flops_utilization(self):
        return None

    def summary(self) -> dict:
        return {
            "total_samples": self.total_samples,
            "total_time": self.total_time,
            "rate": self._rate if self._rate is not None else 0.0,
            "global_rate": self.global_rate,
            "samples_per_sec": self.global_rate,
            "flops_utilization": self.flops_utilization,
        }


def _deprecated(old: str, new: str) -> None:
    warn(f"{old} is deprecated (cerebras_pytorch 2.0/2.1); use {new} instead.", DeprecationWarning)


class Profiler:
    """Runs the activities around an executor's steps and writes ``performance.json``."""

    def __init__(self, outdir, activities=None):
        self.outdir = outdir
        self.activities = {}
        for activity in [RateTrackerActivity] + list(activities or []):
            if not (isinstance(activity, type) and issubclass(activity, Activity)):
                raise CstorchTypeError(
                    f"Profiler activities must be Activity subclasses, got {activity!r}."
                )
            name = activity.name()
            if name in self.activities:
                raise CstorchValueError(f"Two profiler activities are named {name!r}.")
            self.activities[name] = activity()
        self._entered = False
        self._executor = None
        self._op_profiler = None
        self._progress = None
        self._impl = None
        self._step_start_ns = None

    def rate(self) -> float:
        """Deprecated 2.0/2.1 spelling of ``profiler.rate_tracker.rate``."""
        _deprecated("executor.profiler.rate()", "executor.profiler.rate_tracker.rate")
        return self.activities["rate_tracker"].rate

    def global_rate(self) -> float:
        """Deprecated 2.0/2.1 spelling of ``profiler.rate_tracker.global_rate``."""
        _deprecated("executor.profiler.global_rate()", "executor.profiler.rate_tracker.global_rate")
        return self.activities["rate_tracker"].global_rate

    def total_samples(self) -> int:
        """Deprecated 2.0 spelling of ``profiler.rate_tracker.total_samples``."""
        _deprecated(
            "executor.profiler.total_samples()", "executor.profiler.rate_tracker.total_samples"
        )
        return self.activities["rate_tracker"].total_samples

    def total_time(self) -> float:
        """Deprecated 2.0 spelling of ``profiler.rate_tracker.total_time``."""
        _deprecated("executor.profiler.total_time()", "executor.profiler.rate_tracker.total_time")
        return self.activities["rate_tracker"].total_time

    def __getattr__(self, name):
        activities = self.__dict__.get("activities", {})
        if name in activities:
            return activities[name]
        raise AttributeError(name)

    def __enter__(self):
        from cstorch.backend import current_backend_impl
        from cstorch.profiler import ProfilerRegistry

        impl = current_backend_impl(raise_exception=False)
        self._executor = (
            impl.data_executor if impl is not None and impl.data_executor_stack else None
        )
        num_steps = getattr(self._executor, "num_steps", None)
        op_profiler = ProfilerRegistry.get_profiler()
        if op_profiler is not None and num_steps is not None:
            if op_profiler.configure_profiler(impl.is_csx, num_steps) is not None:
                self._op_profiler = op_profiler
        self._progress = (
            _progress.RunProgress(num_steps)
            if getattr(self._executor, "show_progress", True) and runtime_process_index() == 0
            else None
        )
        if self._progress is not None and not self._progress.active:
            self._progress = None
        self._impl = impl
        self._compilations = impl.compilations if impl is not None else 0
        self._entered = True
        for activity in self.activities.values():
            activity.start()
        self._step_start_ns = self._started_ns = time.time_ns()
        return self

    def step(self, batch_size):
        if not self._entered:
            raise CstorchRuntimeError("Profiler.step() was called before the profiler was started.")
        for activity in self.activities.values():
            activity.step(batch_size)
        now = time.time_ns()
        user_step = getattr(self._executor, "user_iteration", None)
        if self._op_profiler is not None and user_step is not None:
            self._op_profiler.record_step(user_step, self._step_start_ns, now)
        if self._progress is not None:
            self._show_step(batch_size)
        self._step_start_ns = now

    def run_starts(self, batch) -> None:
        """Before the first step: the run header, and why nothing moves yet."""
        if self._progress is None:
            return
        from cstorch.utils.data.utils import infer_batch_size

        parameters = sum(t.numel() for t in self._impl.state_view().parameters)
        self._progress.write(
            _progress.run_header(
                self._impl, parameters, self._progress.total, infer_batch_size(batch)
            )
        )
        self._compilations = self._impl.compilations
        # A later run's steps were compiled by an earlier one, unless they are new.
        self._progress.show_status(
            "compiling the step (capture and XLA compile)..."
            if not self._compilations
            else "first step..."
        )

    def _show_step(self, batch_size):
        done = self._executor.user_iteration if self._executor is not None else None
        if done is None:
            return
        outputs = getattr(self._impl, "last_step_outputs", None)
        self._impl.last_step_outputs = None
        if self._progress.first_step_seconds is None:  # whether this run's first step compiled
            self._progress.compiles = self._impl.compilations > self._compilations
        if not self._progress.due(done):
            self._progress.step(done, batch_size or 0, shown=False)
            return
        # Shown: wait for the step's values, so that the clock measures finished steps.
        loss = _wait_for(outputs)
        self._progress.step(done, batch_size or 0, loss=loss, shown=True)

    def printing(self):
        """A context for code that may print (step closures): the bar is cleared first and
        redrawn after, so printed lines never run into it."""
        if self._progress is None:
            import contextlib

            return contextlib.nullcontext()
        return self._progress.printing()

    def __exit__(self, *exc):
        if self._impl is not None:
            self._impl.last_step_outputs = None  # keeps no step's outputs alive after the run
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        self._op_profiler = None
        for activity in self.activities.values():
            activity.stop()
        if self.outdir:
            os.makedirs(self.outdir, exist_ok=True)
            summary = {}
            for name, activity in self.activities.items():
                try:
                    summary[name] = activity.summary()
                except RuntimeError:
                    summary[name] = {}
            # The reference's layout: one activity's summary itself, else one per name.
            if len(summary) == 1:
                (summary,) = summary.values()
            with open(os.path.join(self.outdir, "performance.json"), "w") as f:
                json.dump(summary, f, sort_keys=True, indent=4)
        return False


def runtime_process_index() -> int:
    from cstorch.distributed import runtime

    return runtime.process_index()


def _wait_for(outputs):
    """Waits until a step's outputs exist; returns its loss as a float where the step returned
    one (a scalar floating tensor, or the ``"loss"`` of a dict, or the first of a tuple) and
    this process holds all of it, else None."""
    import torch

    if outputs is None:
        return None
    leaves = torch.utils._pytree.tree_leaves(outputs)
    for leaf in leaves:
        array = getattr(leaf, "jax_array", None)
        if array is not None:
            array.block_until_ready()
    loss = outputs
    if isinstance(outputs, dict):
        loss = outputs.get("loss")
    elif isinstance(outputs, (tuple, list)) and outputs:
        loss = outputs[0]
    if not (isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.is_floating_point()):
        return None
    array = getattr(loss, "jax_array", None)
    if array is not None and not getattr(array, "is_fully_addressable", True):
        return None
    return float(loss.detach())
