"""``DataExecutor``: the loop that feeds a dataloader's batches to compiled steps.

It numbers the steps, decides which are checkpoint and activation steps, runs queued step
closures after each step, cycles an exhausted dataloader, and writes its artifacts under
``<backend.artifact_dir>/executors/<NNNNNN>/``.

A loader shorter than ``num_steps`` is restarted on every backend, CSX included: a script
behaves the same on CPU and on the modeled wafer. (On a real wafer the input workers stream
and repeat the data; cerebras-pytorch 2.10's user loop then yields the first batch again and
again, which has no meaning for a modeled wafer that computes on the batches it is given.)
"""

from __future__ import annotations

import inspect
import math
import pathlib
import warnings
from typing import Dict, Literal, Union

from cstorch.backend import current_backend_impl, run_hooks
from cstorch.utils.data import interrupts
from cstorch.utils.data.dataloader import DataLoader
from cstorch.utils.data.utils import checkpoint_schedule, infer_batch_size
from cstorch.utils.profiler import Profiler
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError, CstorchValueError

# What ``cstorch.backends.csx.performance.micro_batch_size`` accepts (a type hint).
MbsSetting = Union[None, int, Literal["explore", "auto"], Dict[str, Dict[str, int]]]


class RunContext:
    """Where an executor is in its run (step -1 is "before the first step")."""

    def __init__(self, dataloader, num_steps, checkpoint_schedule_, activation_steps):
        if not isinstance(dataloader, DataLoader):
            raise CstorchTypeError(
                f"Expected a cstorch.utils.data.DataLoader, got {type(dataloader).__name__}. "
                "Wrap your input function: cstorch.utils.data.DataLoader(input_fn, ...)"
                + (
                    ", or a loader you already made: cstorch.utils.data.DataLoader(lambda: loader)."
                    if hasattr(dataloader, "__iter__")
                    else "."
                )
            )
        self.dataloader = dataloader
        self.num_steps = num_steps
        self.checkpoint_schedule = checkpoint_schedule_
        self.activation_steps = activation_steps
        self.step = -1

    @property
    def user_iteration(self) -> int:
        return self.step + 1

    @property
    def is_pre_initial_step(self) -> bool:
        return self.step < 0

    @property
    def is_initial_step(self) -> bool:
        return self.step == 0

    @property
    def is_final_step(self) -> bool:
        return self.user_iteration >= self.num_steps

    @property
    def is_checkpoint_step(self) -> bool:
        return self.checkpoint_schedule.match(self.step)

    @property
    def is_activation_step(self) -> bool:
        return self.user_iteration % self.activation_steps == 0 or self.is_final_step


def _executor_index(impl) -> int:
    impl._executor_count = getattr(impl, "_executor_count", 0) + 1
    return impl._executor_count


def _old_keywords(listeners, micro_batch_size) -> None:
    """The 2.2 keywords, which 2.3 moved elsewhere: ``listeners`` (tensor listeners of
    ``cstorch.experimental.listener``; an empty list is what the 2.2 Model Zoo passes when
    its config names none) and ``micro_batch_size`` (now the flag
    ``cstorch.backends.csx.performance.micro_batch_size``, which a given value sets)."""
    if listeners:
        raise CstorchValueError(
            f"DataExecutor(listeners=...) got {len(listeners)} listener(s): tensor listeners "
            "of cerebras-pytorch 2.2 are not supported here; register a traced-tensor hook "
            "with cstorch.experimental.listener.register_traced_tensor_hook instead."
        )
    if micro_batch_size is not None:
        from cstorch.backends import backends

        backends.csx.performance.micro_batch_size = micro_batch_size


def _old_cs_config(cs_config):
    """The 2.0-2.2 ``cs_config``: its ``precision_opt_level`` (which their Model Zoo sets on
    it) becomes ``cstorch.backends.csx.precision.optimization_level``."""
    level = getattr(cs_config, "precision_opt_level", None)
    if level is not None:
        from cstorch.backends import backends

        backends.csx.precision.optimization_level = level
    return cs_config


class DataExecutor:
    """Feeds ``num_steps`` batches of ``dataloader`` to the loop body, one step each.

    Iterate over it (``for batch in executor:``) and call a traced step in the body. It
    numbers the steps, runs queued step closures after each, runs checkpoint closures on the
    steps ``checkpoint_steps`` names (every N steps, and the last), cycles a dataloader
    shorter than ``num_steps``, shows the run's progress and writes its artifacts under
    ``<backend.artifact_dir>/executors/<NNNNNN>/``.
    """

    def __init__(
        self,
        dataloader,
        num_steps=None,
        checkpoint_steps=None,
        activation_steps=None,
        profiler_activities=None,
        *,
        cs_config=None,
        writer=None,
        listeners=None,
        micro_batch_size=None,
    ):
        impl = current_backend_impl()
        _old_keywords(listeners, micro_batch_size)
        if cs_config is not None:  # the 2.0/2.1 spelling: the cluster belongs to the backend
            warnings.warn(
                "DataExecutor(cs_config=...) is deprecated (cerebras_pytorch 2.0/2.1) and has no "
                "effect here: pass cluster_config=cstorch.distributed.ClusterConfig(...) to "
                'cstorch.backend("CSX", ...) instead.',
                DeprecationWarning,
                stacklevel=2,
            )
        if writer is not None:
            warnings.warn(
                "DataExecutor(writer=...) is deprecated (cerebras_pytorch 2.0/2.1): write to "
                "your SummaryWriter inside a step closure instead; this executor logs its "
                "rates to it (avg_samples_per_sec) at the end of the run.",
                DeprecationWarning,
                stacklevel=2,
            )
        self._writer = writer
        self._cs_config = _old_cs_config(cs_config)
        if not impl.is_e2e_execution:
            if num_steps is not None and num_steps > 1:
                warnings.warn(
                    "Compile-only/validate-only runs execute a single step; "
                    f"ignoring num_steps={num_steps}.",
                    stacklevel=2,
                )
            num_steps = 1
        if num_steps is None:
            try:
                num_steps = len(dataloader)
            except TypeError:
                raise CstorchRuntimeError(
                    "Could not infer the number of steps from the dataloader (it has no "
                    "length). Pass num_steps to DataExecutor."
                ) from None
        if not isinstance(num_steps, int) or num_steps < 1:
            raise CstorchRuntimeError(
                f"Expected num_steps to be a positive integer, got {num_steps!r}."
            )
        if activation_steps is None:
            activation_steps = 1
        elif not isinstance(activation_steps, int) or isinstance(activation_steps, bool):
            raise CstorchTypeError(
                f"Expected activation_steps to be an int, got {type(activation_steps).__name__}."
            )
        elif activation_steps < 1:
            raise CstorchRuntimeError(
                f"Expected activation_steps to be at least 1, got {activation_steps}."
            )
        activation_steps = min(activation_steps, num_steps)
        schedule = checkpoint_schedule(checkpoint_steps, num_steps)
        gcd = activation_steps
        for step in schedule.range():
            gcd = math.gcd(gcd, step + 1)
        if gcd != activation_steps:
            warnings.warn(
                f"Lowering activation_steps from {activation_steps} to {gcd} so that "
                "activations are available on every checkpoint step.",
                stacklevel=2,
            )
            activation_steps = gcd
        self.run_context = RunContext(dataloader, num_steps, schedule, activation_steps)
        self.dataloader = dataloader
        self.num_steps = num_steps
        self.checkpoint_steps = checkpoint_steps
        self.activation_steps = activation_steps
        self.profiler_activities = profiler_activities
        self.profiler = None
        self._artifact_dir = None
        # The progress display of long runs (cstorch.utils.progress); a caller that shows its
        # own progress (the Model Zoo Trainer) turns it off.
        self.show_progress = True

    @property
    def cs_config(self):
        """The 2.0-2.2 cluster settings of this run: the ``cs_config`` passed (their Model
        Zoo's models read ``current_executor().cs_config.precision_opt_level``), else one
        holding the current precision optimization level."""
        if self._cs_config is not None:
            return self._cs_config
        from types import SimpleNamespace

        from cstorch.backends import backends

        return SimpleNamespace(precision_opt_level=backends.csx.precision.optimization_level)

    @property
    def writer(self):
        """The SummaryWriter passed as ``writer=`` (2.0-2.2; their Model Zoo writes its
        learning rates through it in step closures), or None."""
        return self._writer

    def __len__(self):
        return self.num_steps

    @property
    def iteration(self) -> int:
        return self.run_context.step

    @property
    def user_iteration(self) -> int:
        return self.run_context.user_iteration

    @property
    def is_initial_step(self) -> bool:
        return self.run_context.is_initial_step

    @property
    def on_final_iteration(self) -> bool:
        return self.run_context.is_final_step

    @property
    def artifact_dir(self) -> pathlib.Path:
        if self._artifact_dir is None:
            raise CstorchRuntimeError(
                "The executor's artifact directory exists only once iteration has started."
            )
        return self._artifact_dir

    def _make_artifact_dir(self, impl) -> pathlib.Path:
        root = pathlib.Path(impl.artifact_dir) / "executors"
        path = root / f"{_executor_index(impl):06d}"
        path.mkdir(parents=True, exist_ok=True)
        latest = root / "latest"
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(path.name)
        return path

    def _batches(self):
        produced = 0
        restarted = False
        while True:
            count = 0
            for batch in self.dataloader:
                count += 1
                yield batch
            produced += count
            if not produced:
                raise CstorchRuntimeError("The dataloader yielded no batches.")
            if count:
                restarted = False
                continue
            # A pass with no batches after some: the input function returned a one-shot
            # iterator (e.g. a generator). Cycle by calling it again, as for a re-iterable
            # loader; if that yields nothing either, say so instead of spinning forever.
            if restarted:
                raise CstorchRuntimeError(
                    f"The dataloader ran out after {produced} batches, before num_steps="
                    f"{self.num_steps}, and calling its input function again gave no batches. "
                    "Return a re-iterable (a list, a torch DataLoader) or a generator that "
                    "yields at least num_steps batches, or lower num_steps."
                )
            self.dataloader.restart()
            restarted = True

    def _stop_if_interrupted(self) -> None:
        """Between two steps: a Ctrl-C held since the last boundary stops the run here
        (``interrupts``); the dataloader's ``state_dict`` then gives this position."""
        if interrupts.take_held():
            self.dataloader.interrupted_run = self.run_context
            raise KeyboardInterrupt

    def __iter__(self):
        impl = current_backend_impl()
        self._artifact_dir = self._make_artifact_dir(impl)
        self.profiler = Profiler(self._artifact_dir, self.profiler_activities)
        self.dataloader.interrupted_run = None
        impl.data_executor_stack.append(self)
        try:
            with interrupts.deferred_to_step_boundaries():
                yield from self._run(impl)
        finally:
            impl.data_executor_stack.remove(self)

    def _run(self, impl):
        impl.on_run_start()
        with self.profiler:
            batches = self._batches()
            for step in range(self.num_steps):
                self._stop_if_interrupted()  # before the next batch is drawn
                batch = next(batches)
                self.run_context.step = step
                if step == 0:
                    self.profiler.run_starts(batch)  # the run header
                yield impl.on_batch_start(batch)
                # The rates are computed before the step's closures, which may read them.
                self.profiler.step(infer_batch_size(batch))
                run_hooks.step_ended()
                with self.profiler.printing():  # closures print on lines of their own
                    impl.on_batch_end()
            self._stop_if_interrupted()
        impl.on_run_end()
        if self._writer is not None:
            tracker = self.profiler.rate_tracker
            self._writer.add_scalar(
                "avg_samples_per_sec", tracker.global_rate, self.run_context.user_iteration
            )
        impl.appliance_tracker.flush(self._artifact_dir / "track.json")


# The 2.0/2.1 keywords cs_config and writer are accepted (deprecated) but are not part of
# the documented 2.10 signature, which is what introspection reports.
DataExecutor.__init__.__signature__ = inspect.signature(DataExecutor.__init__).replace(
    parameters=[
        p
        for p in inspect.signature(DataExecutor.__init__).parameters.values()
        if p.name not in ("cs_config", "writer")
    ]
)


def current_executor() -> DataExecutor:
    """The innermost running ``DataExecutor`` (raises if none is iterating)."""
    return current_backend_impl().data_executor
