"""The Trainer: a training/validation loop assembled from callbacks, run on this engine.

Everything the Trainer does is a callback hook, dispatched in one place (``Trainer.call``):
core callbacks first (artifact dir, reproducibility, backend, model, dataloader, optimizer,
schedulers, precision, sparsity, loop, logging, loss logging, gradient accumulation), then the
user's callbacks and loggers in the order given, then the checkpoint callback (so a
checkpoint sees every other callback's state), then globally registered callbacks.

Each training and validation step is one ``@cstorch.trace`` program: the step body (and the
hooks inside it) runs once, while it is captured; per-batch hooks run eagerly around every
call and read the step's values through step closures.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import re
import warnings
import weakref
from collections import Counter, OrderedDict
from pathlib import Path

import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.artifact_dir import ArtifactDirCallback
from cerebras.modelzoo.trainer.callbacks.autorestart import AutoRestart
from cerebras.modelzoo.trainer.callbacks.backend import BackendCallback
from cerebras.modelzoo.trainer.callbacks.callback import (
    GLOBAL_CALLBACK_REGISTRY,
    Callback,
    CoreCallback,
    ValidationCallback,
)
from cerebras.modelzoo.trainer.callbacks.checkpoint import Checkpoint
from cerebras.modelzoo.trainer.callbacks.dataloader import DataLoaderCallback
from cerebras.modelzoo.trainer.callbacks.grad_accum import GradientAccumulationCallback
from cerebras.modelzoo.trainer.callbacks.logging import Logging
from cerebras.modelzoo.trainer.callbacks.loop import LoopCallback, TrainingLoop, ValidationLoop
from cerebras.modelzoo.trainer.callbacks.loss import LossAccumulationCallback
from cerebras.modelzoo.trainer.callbacks.model import ModelCallback
from cerebras.modelzoo.trainer.callbacks.optimizer import OptimizerCallback
from cerebras.modelzoo.trainer.callbacks.precision import Precision
from cerebras.modelzoo.trainer.callbacks.reproducibility import Reproducibility
from cerebras.modelzoo.trainer.callbacks.schedulers import SchedulersCallback
from cerebras.modelzoo.trainer.callbacks.sparsity import SparsityCallback
from cerebras.modelzoo.trainer.loggers.logger import Logger

# Every hook name the Callback base class defines (a callback may omit none of these).
STANDARD_HOOKS = frozenset(
    name for name, value in vars(Callback).items() if callable(value) and not name.startswith("_")
)

_CONSTRUCTION_HOOKS = frozenset({"pre_setup", "setup", "post_setup"})


def convert_output_to_dict(output) -> dict:
    """A model's output as the Trainer's dict: a bare tensor is the loss."""
    if isinstance(output, dict):
        return output
    if isinstance(output, torch.Tensor):
        return {"loss": output}
    raise TypeError(
        f"The model returned {type(output).__name__}; the Trainer expects the loss tensor or a "
        "dict with a 'loss' key (and any other outputs)."
    )


class _ContinuingStream:
    """The batches of one fit: each training loop continues where the previous one stopped
    (so validating every N steps does not replay the first N batches); a new epoch starts
    when the dataloader is exhausted."""

    def __init__(self, dataloader):
        self.dataloader = dataloader
        self._iterator = None

    def __len__(self):
        return len(self.dataloader)

    def __iter__(self):
        fresh = self._iterator is None  # False: resuming where the previous loop stopped
        produced = False
        while True:
            if self._iterator is None:
                self._iterator = iter(self.dataloader)
            try:
                batch = next(self._iterator)
            except StopIteration:
                self._iterator = None
                if produced or fresh:
                    return  # the end of an epoch (the executor starts the next one)
                fresh = True  # the previous loop stopped exactly at the end of an epoch
                continue
            produced = True
            yield batch


_RUNNING: list = []  # weak references to trainers inside fit/validate, innermost last


def running_trainer():
    """The Trainer whose fit/validate is running (None outside them)."""
    while _RUNNING:
        trainer = _RUNNING[-1]()
        if trainer is not None:
            return trainer
        _RUNNING.pop()
    return None


@contextlib.contextmanager
def _running(trainer):
    _RUNNING.append(weakref.ref(trainer))
    try:
        yield
    finally:
        _RUNNING.pop()


def _default_callbacks() -> list:
    """What a Trainer built in Python logs when given no callbacks, as the YAML path does by
    default (and the HF Trainer always): the learning rate of every param group (``lr/<i>``),
    the gradient and parameter norms (``model_wise_grad_norm``, ``model_wise_params_norm``)
    and the steady throughput (``avg_samples_per_sec``, ``rate``). Pass ``callbacks=[]`` for
    none (the Model Zoo's Python Trainer adds none)."""
    from cerebras.modelzoo.trainer.callbacks.norm import ComputeNorm
    from cerebras.modelzoo.trainer.callbacks.optimizer import LogOptimizerParamGroup
    from cerebras.modelzoo.trainer.callbacks.profiler import RateProfiler

    return [LogOptimizerParamGroup("lr"), ComputeNorm(), RateProfiler()]


class Trainer:
    """``Trainer(device=None, backend=None, model_dir=..., model=..., optimizer=None,
    schedulers=None, precision=None, sparsity=None, loop=None, checkpoint=None, logging=None,
    callbacks=None, loggers=None, seed=None, autorestart=None)``.

    ``device`` ("CSX", "CPU", "GPU") creates the backend, or ``backend`` is one already made;
    ``model`` is a module or a zero-argument factory; ``optimizer`` an optimizer or a factory
    of the model (required if ``model`` is a factory); ``schedulers`` schedulers or factories
    of the optimizer.
    """

    def __init__(
        self,
        device=None,
        backend=None,
        model_dir=...,
        model=...,
        optimizer=None,
        schedulers=None,
        precision=None,
        sparsity=None,
        loop=None,
        checkpoint=None,
        logging=None,
        callbacks=None,
        loggers=None,
        seed=None,
        autorestart=None,
    ):
        if model_dir is Ellipsis:
            raise ValueError("model_dir is a required argument")
        if model is Ellipsis:
            raise ValueError("model is a required argument")
        if not isinstance(model, torch.nn.Module) and isinstance(
            optimizer, cstorch.optim.Optimizer
        ):
            raise ValueError(
                "model is a factory, so the model does not exist yet and an already built "
                "optimizer cannot hold its parameters: pass optimizer as a function that takes "
                "the model and returns a cstorch.optim.Optimizer (e.g. lambda model: "
                "cstorch.optim.SGD(model.parameters(), lr=0.1))."
            )
        if precision is not None and not isinstance(precision, Precision):
            raise TypeError(
                f"Expected precision to be a Precision callback (e.g. "
                f"MixedPrecision(...)), got {type(precision).__name__}."
            )
        loop = TrainingLoop(num_epochs=1) if loop is None else loop
        checkpoint = Checkpoint() if checkpoint is None else checkpoint
        logging = Logging(log_steps=1, log_level="INFO") if logging is None else logging
        autorestart = AutoRestart() if autorestart is None else autorestart
        for name, value, kind in (
            ("loop", loop, LoopCallback),
            ("checkpoint", checkpoint, Checkpoint),
            ("logging", logging, Logging),
            ("autorestart", autorestart, AutoRestart),
        ):
            if not isinstance(value, kind):
                raise TypeError(
                    f"Expected {name} to be a {kind.__name__}, got {type(value).__name__}."
                )

        self.model_dir = Path(model_dir)
        self.artifact_dir: Path = None
        self.summary_dir: Path = None
        self.backend = None
        self.model = None
        self.compiled_model = None
        self.optimizer = None
        self.schedulers = []
        self.executor = None
        self.global_step = 0
        self.activation_steps = None
        self.non_standard_hooks_whitelist: set = set()
        self._name_scope_stack: list = []
        self._val_scopes: dict = {}
        self._validation_steps: dict = {}  # validation-loop hook name -> traced step
        self.training_step = cstorch.trace(self._training_step)

        self.callbacks: "OrderedDict[str, Callback]" = OrderedDict(
            [
                ("autorestart", autorestart),
                ("artifact_dir", ArtifactDirCallback()),
                ("reproducibility", Reproducibility(seed)),
                ("backend", BackendCallback(backend, device)),
                ("model", ModelCallback(model)),
                ("dataloader", DataLoaderCallback()),
                ("optimizer", OptimizerCallback(optimizer)),
                ("schedulers", SchedulersCallback(schedulers)),
                ("precision", precision),
                ("sparsity", SparsityCallback(sparsity)),
                ("loop", loop),
                ("logging", logging),
                ("loss_accum", LossAccumulationCallback()),
                ("grad_accum", GradientAccumulationCallback()),
                ("checkpoint", checkpoint),
            ]
        )
        user_callbacks = list(callbacks) if callbacks is not None else _default_callbacks()
        self.loggers = list(loggers or [])
        for logger in self.loggers:
            if not isinstance(logger, Logger):
                raise TypeError(
                    f"logger must be an instance of Logger. Got: "
                    f"{type(logger).__name__}. Pass plain callbacks as callbacks=."
                )
        for callback in user_callbacks:
            if isinstance(callback, CoreCallback):
                raise ValueError(
                    f"Callback {type(callback).__name__} is a core callback and cannot be "
                    "overridden: pass it through its own Trainer argument (loop=, "
                    "checkpoint=, logging=, precision=, ...)."
                )
            if not isinstance(callback, Callback):
                raise TypeError(
                    f"Expected each callback to be a Callback, got {type(callback).__name__}."
                )
            if isinstance(callback, Logger):
                warnings.warn(
                    f"{type(callback).__name__} was passed as a callback, so "
                    "trainer.log_metrics() will not write to it; pass it in "
                    "loggers= instead.",
                    stacklevel=2,
                )
        self._logger_destinations = {logger.name for logger in self.loggers}
        counts = Counter()
        for callback in user_callbacks + self.loggers:
            name = type(callback).__name__
            counts[name] += 1
            self.callbacks[name if counts[name] == 1 else f"{name}_{counts[name]}"] = callback
        self.callbacks.move_to_end("checkpoint")  # checkpoints see every other callback's state

        self.call("pre_setup")
        self.call("setup")
        self.call("post_setup")
        self._finalizer = weakref.finalize(self, _finalize, list(self.callbacks.values()))

    # ----------------------------------------------------------------------------- dispatch
    @property
    def all_callbacks(self):
        yield from (c for c in self.callbacks.values() if c is not None)
        yield from list(GLOBAL_CALLBACK_REGISTRY.values())

    @property
    def standard_hooks(self) -> frozenset:
        return STANDARD_HOOKS

    def call(self, hook_name: str, *args, **kwargs):
        """Calls ``hook_name(self, *args, **kwargs)`` on every callback, in order. An error in
        a hook is re-raised as RuntimeError naming the callback and hook (errors of the
        construction hooks keep their type: they are errors in the Trainer's arguments)."""
        seen = set()
        for callback in self.all_callbacks:
            if id(callback) in seen:
                continue
            seen.add(id(callback))
            hook = getattr(callback, hook_name, None)
            if hook is None:
                if hook_name in self.non_standard_hooks_whitelist:
                    continue
                raise AttributeError(
                    f"Callback {type(callback).__name__} does not implement {hook_name}"
                )
            try:
                hook(self, *args, **kwargs)
            except Exception as error:
                where = f"{type(callback).__name__}.{hook_name}"
                if hook_name in _CONSTRUCTION_HOOKS:
                    # Errors while building are argument errors of the Trainer: keep their
                    # type (ValueError, TypeError, ...) so callers can tell them apart.
                    error.add_note(f"(raised by {where} while constructing the Trainer)")
                    raise
                # (the cause's first line too: the last line of a traceback names the problem)
                summary = str(error).strip().splitlines()[:1]
                raise RuntimeError(
                    f"Encountered error when calling {where}: "
                    f"{type(error).__name__}: {''.join(summary)}"
                ) from error

    @contextlib.contextmanager
    def on_exception(self, kind: str):
        """Runs the ``on_<kind>_exception`` hooks when the block raises (then re-raises)."""
        try:
            yield
        except Exception as error:
            try:
                self.call(f"on_{kind}_exception", error)
            except Exception as hook_error:
                raise hook_error from error
            raise

    def get_callbacks(self, callback_type):
        return (c for c in self.all_callbacks if isinstance(c, callback_type))

    def get_callback(self, callback_type):
        return next(self.get_callbacks(callback_type), None)

    def get_callback_name(self, callback) -> str:
        for name, candidate in self.callbacks.items():
            if candidate is callback:
                return name
        raise ValueError(f"Callback {type(callback).__name__} is not one of this trainer's.")

    @property
    def validation_callbacks(self) -> list:
        return list(self.get_callbacks(ValidationCallback))

    # --------------------------------------------------------------------------- properties
    @property
    def precision(self):
        return self.callbacks["precision"]

    @property
    def loop(self) -> LoopCallback:
        return self.callbacks["loop"]

    @property
    def checkpoint(self) -> Checkpoint:
        return self.callbacks["checkpoint"]

    @property
    def logging(self) -> Logging:
        return self.callbacks["logging"]

    @property
    def autorestart(self) -> AutoRestart:
        return self.callbacks["autorestart"]

    @property
    def grad_accum(self) -> GradientAccumulationCallback:
        return self.callbacks["grad_accum"]

    @property
    def should_run_optimizer_step(self) -> bool:
        return self.grad_accum.should_run_optimizer_step

    @property
    def logger(self):
        return self.logging.logger

    @property
    def is_log_step(self) -> bool:
        return self.logging.is_log_step(self)

    @property
    def is_first_iteration(self) -> bool:
        return self.executor is not None and self.executor.iteration == 0

    @property
    def is_final_iteration(self) -> bool:
        return self.executor is not None and self.executor.on_final_iteration

    @property
    def is_tracing(self) -> bool:
        return self.backend.is_tracing

    # ------------------------------------------------------------------------------ metrics
    @contextlib.contextmanager
    def name_scope(self, name: str):
        """Prefixes metrics logged inside the block with ``name/``."""
        self._name_scope_stack.append(name)
        try:
            yield name
        finally:
            self._name_scope_stack.pop()

    @property
    def name_scope_path(self) -> str:
        return "".join(f"{name}/" for name in self._name_scope_stack)

    def get_val_dataloader_scope(self, val_dataloader) -> str:
        return self._val_scopes.setdefault(val_dataloader.id, f"validate_{len(self._val_scopes)}")

    def remove_logger_destination(self, name: str):
        self._logger_destinations.discard(name)

    def log_metrics(self, **metrics):
        """Logs ``metrics`` to the loggers at the global step (inside a step: with the values
        of each step, through a step closure; outside log steps: dropped)."""
        self.log_metrics_dict(metrics)

    @cstorch.step_closure
    def _log_metrics_in_step_closure(self, metrics, step, dest):
        self.log_metrics_dict(metrics, step=step, dest=dest)

    def log_metrics_dict(self, metrics: dict, step=None, dest=None):
        if self.is_tracing:
            self._log_metrics_in_step_closure(metrics, step, dest)
            return
        if self.executor is not None and not self.is_log_step:
            return
        if not self.loggers:
            return
        if dest is None:
            dest = self._logger_destinations
        elif isinstance(dest, str):
            dest = {dest}
        else:
            dest = set(dest)
        prefix = (
            ""
            if any(getattr(logger, "legacy_event_dirs", False) for logger in self.loggers)
            else self.name_scope_path
        )
        step = self.global_step if step is None else step
        named = {f"{prefix}{key}": value for key, value in metrics.items()}
        matched = False
        for logger in self.loggers:
            if logger.name in dest:
                matched = True
                logger.log_metrics(named, step)
        if not matched:
            warnings.warn(
                f"None of the loggers matched the destinations {sorted(dest)}.", stacklevel=2
            )

    # -------------------------------------------------------------------------------- steps
    def _training_step(self, batch):
        """The traced training step (its body runs once per compiled program)."""
        self.call("on_train_step_start", self.model, batch)
        outputs = self.forward(batch)
        self.backward(outputs)
        if self.optimizer is not None and self.should_run_optimizer_step:
            self.optimizer_step()
            self.optimizer_zero_grad()
            self.schedulers_step()
        self.call("on_train_step_end", self.model, outputs, batch)
        return outputs

    def _validation_step_for(self, loop: ValidationLoop):
        """One traced validation step per hook name (the hooks are part of the graph)."""
        if loop.hook not in self._validation_steps:

            def validation_step(batch):
                self.call(loop.on_step_start_hook, self.model, batch)
                outputs = self.forward(batch)
                self.call(loop.on_step_end_hook, self.model, outputs, batch)
                return outputs

            validation_step.__name__ = f"{loop.hook}_step"
            self._validation_steps[loop.hook] = cstorch.trace(torch.no_grad()(validation_step))
        return self._validation_steps[loop.hook]

    def forward(self, batch) -> dict:
        context = (
            self.precision.autocast_context_manager()
            if self.precision
            else (contextlib.nullcontext())
        )
        with context:
            args, kwargs = [batch], {}
            self.call("on_before_forward", self.model, batch, args, kwargs)
            outputs = convert_output_to_dict(self.compiled_model(*args, **kwargs))
            self.call("on_after_forward", self.model, outputs, batch)
        return outputs

    def backward(self, outputs: dict):
        self.call("on_before_backward", self.model, outputs)
        if self.precision:
            self.precision.backward(outputs["loss"])
        else:
            outputs["loss"].backward()
        self.call("on_after_backward", self.model, outputs)

    def optimizer_step(self):
        self.call("on_before_optimizer_step", self.model, self.optimizer)
        if self.precision:
            self.precision.clip_gradients(self.optimizer)
            self.precision.optimizer_step(self.optimizer)
        else:
            self.optimizer.step()
        self.call("on_after_optimizer_step", self.model, self.optimizer)

    def optimizer_zero_grad(self):
        self.call("on_before_optimizer_zero_grad", self.model, self.optimizer)
        self.optimizer.zero_grad()
        self.call("on_after_optimizer_zero_grad", self.model, self.optimizer)

    def schedulers_step(self):
        for scheduler in self.schedulers:
            self.call("on_before_scheduler_step", self.model, self.optimizer, scheduler)
            scheduler.step()
            self.call("on_after_scheduler_step", self.model, self.optimizer, scheduler)

    # ---------------------------------------------------------------------------------- fit
    def fit(self, train_dataloader, val_dataloader=None, ckpt_path=...):
        """Trains for the loop's steps, validating every ``eval_frequency`` steps.

        ``ckpt_path``: a checkpoint to start from; ``...`` loads the latest one in the
        checkpoint directory if ``Checkpoint(autoload_last_checkpoint=True)``; None loads none.
        """
        loop = self.loop
        if not isinstance(loop, TrainingLoop):
            raise TypeError(
                f"fit needs the Trainer's loop to be a TrainingLoop, got {type(loop).__name__}."
            )
        with contextlib.ExitStack() as stack:
            stack.enter_context(_running(self))
            self.call("on_enter_fit", stack, train_dataloader, val_dataloader, loop)
            self.load_checkpoint(ckpt_path)
            self.call("on_fit_start", train_dataloader, val_dataloader, loop)
            continuing = _ContinuingStream(train_dataloader)
            stream = cstorch.utils.data.DataLoader(lambda: continuing)
            for loop_idx in range(loop.num_trains):
                self._run_train(train_dataloader, stream, loop, loop_idx)
                if loop.eval_frequency:
                    is_last = loop_idx == loop.num_trains - 1
                    self._validate_all(
                        val_dataloader,
                        None,
                        None,
                        functools.partial(
                            self.call, "run_validation", loop_idx=loop_idx, is_last=is_last
                        ),
                    )
            self.call("on_fit_end", loop)

    def _run_train(self, train_dataloader, stream, loop, loop_idx):
        with contextlib.ExitStack() as stack:
            self.call("on_enter_train", stack, train_dataloader, loop, loop_idx)
            self.call("on_train_start", self.model, train_dataloader, loop, loop_idx)
            self.executor = cstorch.utils.data.DataExecutor(
                stream,
                num_steps=loop.train_steps[loop_idx],
                checkpoint_steps=loop.checkpoint_steps(self.checkpoint.steps, loop_idx),
                activation_steps=self.activation_steps,
                profiler_activities=[],
            )
            self.executor.show_progress = False  # the ProgressLogger shows the whole fit
            try:
                for batch_idx, batch in enumerate(self.executor):
                    self.call("on_train_batch_start", self.model, batch, batch_idx)
                    outputs = self.training_step(batch)
                    self.call("on_train_batch_end", self.model, outputs, batch, batch_idx)
                self.call("on_train_end", self.model, loop, loop_idx)
            finally:
                self.executor = None

    # --------------------------------------------------------------------------- validation
    def validate(self, val_dataloader=None, ckpt_path=..., loop=None):
        """One validation loop over ``val_dataloader`` (``loop`` default: the training loop's
        ``val_loop``)."""
        if not isinstance(val_dataloader, cstorch.utils.data.DataLoader):
            raise TypeError(
                f"val_dataloader must be a cstorch.utils.data.DataLoader, got "
                f"{type(val_dataloader).__name__}."
            )
        if loop is None:
            loop = self.loop.val_loop if isinstance(self.loop, TrainingLoop) else self.loop
        if not isinstance(loop, ValidationLoop):
            raise TypeError(f"Expected loop to be a ValidationLoop, got {type(loop).__name__}.")
        with contextlib.ExitStack() as stack:
            stack.enter_context(_running(self))
            stack.enter_context(self.name_scope(self.get_val_dataloader_scope(val_dataloader)))
            if all(loop is not c for c in self.all_callbacks):
                stack.enter_context(loop)  # its hooks run for this loop only
            self.call("on_enter_validate", stack, val_dataloader, loop)
            self.load_checkpoint(ckpt_path)
            eval_steps = loop.compute_eval_steps(self, val_dataloader)
            self.call(loop.on_start_hook, self.model, val_dataloader, loop)
            step = self._validation_step_for(loop)
            self.executor = cstorch.utils.data.DataExecutor(
                val_dataloader, num_steps=eval_steps, profiler_activities=[]
            )
            self.executor.show_progress = False
            try:
                for batch_idx, batch in enumerate(self.executor):
                    self.call(loop.on_batch_start_hook, self.model, batch, batch_idx)
                    outputs = step(batch)
                    self.call(loop.on_batch_end_hook, self.model, outputs, batch, batch_idx)
                self.call(loop.on_end_hook, self.model, loop)
            finally:
                self.executor = None

    def validate_all(self, val_dataloaders=None, ckpt_paths=..., loop=None):
        """For each checkpoint (paths or glob patterns): validate on every dataloader, then
        run the downstream ValidationCallbacks."""
        self._validate_all(
            val_dataloaders,
            ckpt_paths,
            loop,
            functools.partial(self.call, "run_validation", loop_idx=None, is_last=True),
        )

    def _validate_all(self, val_dataloaders, ckpt_paths, loop, run_validation):
        if val_dataloaders is None:
            val_dataloaders = []
        elif not isinstance(val_dataloaders, (list, tuple)):
            val_dataloaders = [val_dataloaders]
        for i, loader in enumerate(val_dataloaders):
            if not isinstance(loader, cstorch.utils.data.DataLoader):
                raise TypeError(
                    f"Expected val_dataloader {i} to be a "
                    f"cstorch.utils.data.DataLoader, got {type(loader).__name__}."
                )
        if ckpt_paths is Ellipsis or ckpt_paths is None:
            ckpt_paths = [ckpt_paths]
        else:
            if isinstance(ckpt_paths, (str, os.PathLike)):
                ckpt_paths = [ckpt_paths]
            files = []
            for pattern in ckpt_paths:
                if not isinstance(pattern, (str, os.PathLike)):
                    raise ValueError(
                        f"Expected a checkpoint path or glob pattern, got {pattern!r}."
                    )
                matches = sorted(glob.glob(str(pattern)), key=_natural_order)
                if not matches:
                    raise FileNotFoundError(f"Checkpoint file(s) not found at: {pattern}")
                files += [Path(m) for m in matches]
            ckpt_paths = files
        with contextlib.ExitStack() as stack:
            self.call("on_enter_validate_all", stack, val_dataloaders, loop, ckpt_paths)
            for ckpt_path in ckpt_paths:
                self.load_checkpoint(ckpt_path)
                for loader in val_dataloaders:
                    self.validate(loader, ckpt_path=None, loop=loop)
                run_validation()

    # -------------------------------------------------------------------------- checkpoints
    @cstorch.checkpoint_closure
    def save_checkpoint(self):
        """Writes ``checkpoint_<global_step>.mdl`` (a checkpoint closure: it runs after the
        step, and only on the executor's checkpoint steps). Compile- and validate-only runs
        compute no weights and save nothing."""
        if not self.backend.is_e2e_execution:
            return
        state_dict = {}
        self.call("on_save_checkpoint", state_dict)
        self.call("postprocess_checkpoint", state_dict)
        path = self.checkpoint.get_checkpoint_path(self.global_step)
        cstorch.save(state_dict, str(path))
        self.call("on_after_save_checkpoint", path)

    def load_checkpoint(self, ckpt_path=None):
        """Loads ``ckpt_path`` (``...``: the latest one, if autoloading) into every callback."""
        if not self.backend.is_e2e_execution:
            return
        autoloaded = ckpt_path is Ellipsis
        if autoloaded:
            ckpt_path = (
                self.checkpoint.get_latest_checkpoint(self)
                if self.checkpoint.autoload_last_checkpoint
                else None
            )
        if not ckpt_path:
            self.call("on_before_load_checkpoint", None)
            return
        if not Path(ckpt_path).exists():
            raise FileNotFoundError(f"Checkpoint {ckpt_path} does not exist.")
        cstorch.storage.check_regular(ckpt_path, "checkpoint")  # not a FIFO, device, directory
        self.call("on_before_load_checkpoint", ckpt_path)
        state_dict = cstorch.load(str(ckpt_path))
        try:
            self.call("preprocess_checkpoint", state_dict)
            self.call("on_load_checkpoint", state_dict)
        except RuntimeError as error:
            if not autoloaded:
                raise
            # The user did not name this file: the newest one in model_dir was picked, most
            # often left there by an earlier run of a different model.
            cause = error.__cause__ or error
            raise RuntimeError(
                f"The newest checkpoint in model_dir, {ckpt_path}, does not fit this model; "
                f"it was loaded automatically and is probably left from an earlier run of a "
                f"different model. Either use a new model_dir for this model, or start from "
                f"its initial weights with autoload_last_checkpoint: false (in the YAML's "
                f"init.checkpoint; Checkpoint(autoload_last_checkpoint=False) in Python). "
                f"Loading it failed with:\n{type(cause).__name__}: {cause}"
            ) from cause


def _natural_order(path: str):
    """Sort key that puts checkpoint_12 before checkpoint_100."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def _finalize(callbacks):
    for callback in callbacks:
        if callback is not None:
            callback.finalize()
