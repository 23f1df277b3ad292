"""``PyTorchBaseRunner``: the Model Zoo 1.x training and evaluation loops, with their hooks.

Every hook and driver keeps the 1.x name, signature and call order, so custom runners that
subclass a runner and override hooks keep working. What differs is how a batch runs: the
whole per-batch step is captured once as one compiled program (``@cstorch.trace``), as on a
Cerebras system:

* host hooks run for every batch, outside the step: ``on_train_batch_start(data)`` (returns
  the data), ``on_train_batch_end(loss, epoch, step)`` (``loss`` holds the value of its own
  step), the epoch and run hooks, logging, checkpointing;
* the step-internal methods ``optimizer_zero_grad``, ``train_forward``, ``backward``,
  ``optimizer_step`` and ``lr_scheduler_step`` (and ``eval_forward`` in eval) are **traced**:
  they run once, when the step is compiled, and their torch ops become the program that runs
  for every batch. Python side effects in them (prints, counters, ``.item()``) happen once;
  use ``cstorch.step_closure`` for per-step host work inside them.

Per training step: ``on_train_batch_start`` for each of the ``grad_accum_steps``
micro-batches, then the step (zero grads, ``train_forward`` + ``backward`` per micro-batch,
``optimizer_step``, ``lr_scheduler_step``), ``_increment_global_step``,
``on_train_batch_end(accumulated loss, epoch, step)``, ``_should_stop``.

Checkpoints are ``<model_dir>/checkpoint_<step>.mdl`` in the cstorch format (``cstorch.load``
reads them). Without ``--checkpoint_path`` the latest one in ``model_dir`` is loaded
(``runconfig.autoload_last_checkpoint``, default true).
"""

from __future__ import annotations

import abc
import contextlib
import copy
import itertools
import logging
import math
import os
import warnings
from contextlib import ExitStack
from typing import Optional, Tuple

import torch

import cstorch
from cerebras_pytorch.lazy.outputs import extract_loss
from modelzoo.common.pytorch import modes
from modelzoo.common.pytorch.metrics import compute_all_metrics, reset_all_metrics
from modelzoo.common.pytorch.PyTorchBaseModel import PyTorchBaseModel
from modelzoo.common.pytorch.utils import get_checkpoints, visit_structure


class _MicroBatchGroups:
    """A dataloader's batches in groups of ``size`` (one group per optimizer step)."""

    def __init__(self, dataloader, size: int):
        self.dataloader = dataloader
        self.size = size

    def __len__(self):
        return len(self.dataloader) // self.size

    def __iter__(self):
        batches = iter(self.dataloader)
        while True:
            group = list(itertools.islice(batches, self.size))
            if len(group) < self.size:
                return
            yield group


class PyTorchBaseRunner(metaclass=abc.ABCMeta):
    """The base class for running PyTorch models on any device."""

    def __init__(self, model: PyTorchBaseModel, params: dict):
        self._model = model
        self._params = copy.deepcopy(params)
        self._optimizer = None
        self._lr_scheduler = None
        self._scaler = getattr(model, "grad_scaler", None)

        mode = self._runconfig["mode"]
        if mode in (modes.TRAIN, modes.TRAIN_AND_EVAL):
            self._optimizer = model.get_optimizer()
            self._lr_scheduler = model.get_lr_scheduler()
        self._active_mode = mode

        self._mixed_precision = self._params["model"]["mixed_precision"]
        oparams = self._params.get("optimizer") or {}
        self._grad_accum_steps = oparams.get("grad_accum_steps", 1)
        self._log_summaries = oparams.get("log_summaries", False)
        self._show_debug_metrics = self._runconfig.get("show_debug_metrics", False)
        self._save_losses = self._runconfig.get("save_losses", True)
        self._check_loss_values = self._runconfig.get("check_loss_values", True)
        self._model_dir = self._runconfig.get("model_dir", "./")

        self._checkpoint_path = self._runconfig.get("checkpoint_path")
        if not self._checkpoint_path and self._runconfig.get("autoload_last_checkpoint", True):
            self._checkpoint_path = self._get_last_checkpoint()
        self._is_pretrained_checkpoint = self._runconfig.get("is_pretrained_checkpoint", False)
        self._save_initial_checkpoint = self._runconfig.get("save_initial_checkpoint", False)

        unsupported = [
            name
            for name, on in (
                ("optimizer.log_summaries", self._log_summaries),
                ("runconfig.enable_summaries", self._runconfig.get("enable_summaries")),
                ("runconfig.save_stream_size", self._runconfig.get("save_stream_size")),
                ("runconfig.show_debug_metrics", self._show_debug_metrics),
            )
            if on
        ]
        if unsupported:
            warnings.warn(
                f"{', '.join(unsupported)}: these 1.x debugging summaries are not "
                "produced by this engine; the run goes on without them."
            )

        self._writers = {}
        self.__cleanup_stack = None
        self._global_step = None
        self._initial_step = None
        self._total_steps = None
        self._eval_losses = []
        self._traced_train_step = None
        self._traced_eval_step = None

    # ------------------------------------------------------------------ properties
    @property
    def _runconfig(self) -> dict:
        return self._params["runconfig"]

    @property
    def _writer(self):
        return self._writers.get(self._active_mode)

    @property
    def _run_step(self) -> int:
        """The number of steps this run has taken (global step minus the initial step)."""
        return self._global_step - self._initial_step

    @property
    def _loss_dir(self) -> str:
        loss_dir = os.path.join(self._model_dir, "losses")
        os.makedirs(loss_dir, exist_ok=True)
        return loss_dir

    @property
    def _cleanup_stack(self) -> ExitStack:
        if self.__cleanup_stack is None:
            raise RuntimeError("The cleanup stack only exists while a run is executing.")
        return self.__cleanup_stack

    @property
    def _should_log_extra_summaries(self) -> bool:
        return False  # grad/param norm summaries are not produced by this engine

    def is_master_ordinal(self) -> bool:
        return True

    # ------------------------------------------------------------------ run configuration
    def _validate_config(self):
        if self._num_epochs is not None and self._num_steps is not None:
            raise ValueError("Please specify only one of `num_epochs` or `num_steps`.")
        if self._num_epochs is None and self._num_steps is None and self._max_steps is None:
            raise ValueError(
                "`max_steps` must be specified if neither `num_epochs` nor "
                "`num_steps` are specified."
            )
        for name in (
            "num_epochs",
            "num_steps",
            "max_steps",
            "train_steps_per_epoch",
            "eval_steps_per_epoch",
        ):
            value = getattr(self, f"_{name}")
            if value is not None and value <= 0:
                raise ValueError(f"When provided, `{name}` must be greater than zero, got {value}.")
        if self._grad_accum_steps < 1:
            raise ValueError(f"grad_accum_steps must be at least 1, got {self._grad_accum_steps}.")
        if self._checkpoint_steps < 0 or self._log_steps < 0:
            raise ValueError("checkpoint_steps and log_steps must be non-negative.")

    def _should_stop(self, epoch_step: int, mode: str) -> Tuple[bool, bool]:
        """``(exit_epoch, exit_training)`` after step ``epoch_step`` of an epoch."""
        if mode == modes.TRAIN:
            steps_per_epoch = self._train_steps_per_epoch
        elif mode == modes.EVAL:
            steps_per_epoch = self._eval_steps_per_epoch
        else:
            raise ValueError(f"Unhandled mode: {mode}.")
        exit_epoch = bool(steps_per_epoch and epoch_step + 1 >= steps_per_epoch)
        exit_training = mode == modes.TRAIN and self._run_step >= self._total_steps
        return exit_epoch or exit_training, exit_training

    def _configure_run_steps(self, dataloader, mode: str):
        """Sets the step budget: ``_total_steps`` is the least of ``num_epochs`` epochs,
        ``num_steps``, and ``max_steps`` minus the global step; eval runs the whole loader
        unless ``eval_steps``."""
        self._log_steps = self._runconfig.get("log_steps", 1) or 0
        if mode in (modes.TRAIN, modes.TRAIN_AND_EVAL):
            self._num_epochs = self._runconfig.get("num_epochs")
            self._num_steps = self._runconfig.get("num_steps")
            self._max_steps = self._runconfig.get("max_steps")
            self._checkpoint_steps = self._runconfig.get("checkpoint_steps") or 0
        elif mode == modes.EVAL:
            self._num_epochs, self._num_steps, self._max_steps = 1, None, None
            self._checkpoint_steps = 0
        else:
            raise ValueError(f"Unhandled mode: {mode}.")
        self._train_steps_per_epoch = self._runconfig.get("steps_per_epoch")
        self._eval_steps_per_epoch = self._runconfig.get("eval_steps")
        self._validate_config()
        if self._max_steps is not None and self._global_step >= self._max_steps:
            raise RuntimeError(
                f"Global step {self._global_step} already reaches max_steps "
                f"{self._max_steps}: nothing to train. Raise max_steps, or "
                "start from another checkpoint."
            )
        train_loader, eval_loader = {
            modes.TRAIN: (dataloader, None),
            modes.EVAL: (None, dataloader),
            modes.TRAIN_AND_EVAL: tuple(dataloader) if mode == modes.TRAIN_AND_EVAL else (),
        }[mode]

        if train_loader is not None:
            try:
                per_epoch = len(train_loader)
            except TypeError:
                if self._num_epochs is not None:
                    raise ValueError(
                        "num_epochs needs a dataloader with a length; control "
                        "training with num_steps or max_steps instead."
                    ) from None
                per_epoch = None
            if per_epoch is not None:
                if per_epoch <= 0:
                    raise ValueError("The train dataloader does not generate any batches.")
                if self._train_steps_per_epoch is not None:
                    if self._train_steps_per_epoch > per_epoch:
                        raise ValueError(
                            f"steps_per_epoch={self._train_steps_per_epoch} exceeds the "
                            f"{per_epoch} batches of an epoch."
                        )
                    per_epoch = self._train_steps_per_epoch
                if self._grad_accum_steps > per_epoch:
                    raise ValueError(
                        f"grad_accum_steps={self._grad_accum_steps} is greater than the "
                        f"{per_epoch} batches per epoch: no optimizer step could be taken."
                    )
                per_epoch //= self._grad_accum_steps
            self._train_steps_per_epoch = per_epoch
        if eval_loader is not None:
            try:
                eval_len = len(eval_loader)
                if eval_len <= 0:
                    raise ValueError("The eval dataloader does not generate any batches.")
                if self._eval_steps_per_epoch is not None and self._eval_steps_per_epoch > eval_len:
                    raise ValueError(
                        f"eval_steps={self._eval_steps_per_epoch} exceeds the "
                        f"{eval_len} batches of the eval dataloader."
                    )
                self._eval_steps_per_epoch = self._eval_steps_per_epoch or eval_len
            except TypeError:
                if self._eval_steps_per_epoch is None:
                    raise ValueError(
                        "`eval_steps` must be specified for datasets with unknown length."
                    ) from None

        if mode in (modes.TRAIN, modes.TRAIN_AND_EVAL):
            total = math.inf
            per_epoch = self._train_steps_per_epoch
            if self._num_epochs is not None:
                total = min(total, self._num_epochs * per_epoch)
            if self._num_steps is not None:
                total = min(total, self._num_steps)
            if self._max_steps is not None:
                total = min(total, self._max_steps - self._global_step)
            self._total_steps = int(total)
            self._num_epochs = math.ceil(self._total_steps / per_epoch) if per_epoch else 1
            if self._train_steps_per_epoch is None:
                self._train_steps_per_epoch = self._total_steps
            self._checkpoint_steps = min(self._checkpoint_steps, self._total_steps)
        else:
            self._total_steps = self._eval_steps_per_epoch
        self._fetch_steps = min(self._log_steps, self._total_steps) or self._total_steps

    def _is_fetch_step_helper(self, step, step_offset: int = 0) -> bool:
        step = step + step_offset
        return step == self._total_steps or (
            self._fetch_steps > 0 and step % self._fetch_steps == 0
        )

    def _is_fetch_step(self, step_offset: int = 0) -> bool:
        return self._is_fetch_step_helper(self._run_step, step_offset)

    def _is_checkpoint_step(self, step_offset: int = 0) -> bool:
        step = self._run_step + step_offset
        return self._checkpoint_steps > 0 and (
            step == self._total_steps or step % self._checkpoint_steps == 0
        )

    @contextlib.contextmanager
    def _configure_run(self, mode: str, dataloader):
        """Loads the checkpoint, opens the summary writers and sets the step budget."""
        from cstorch.utils.tensorboard import SummaryWriter

        if not self._model.supports_mode(mode):
            raise ValueError(
                f"{mode} not supported for model. Supported modes include: "
                f"{self._model.supported_modes}."
            )
        self._maybe_load_checkpoint(self._checkpoint_path, mode)
        if self._save_initial_checkpoint and mode != modes.EVAL:
            self._save_checkpoint(self._global_step)
        self._writers = {}
        if mode in (modes.EVAL, modes.TRAIN_AND_EVAL):
            self._writers[modes.EVAL] = SummaryWriter(
                log_dir=os.path.join(self._model_dir, modes.EVAL)
            )
            self._active_mode = modes.EVAL
        if mode in (modes.TRAIN, modes.TRAIN_AND_EVAL):
            self._writers[modes.TRAIN] = SummaryWriter(
                log_dir=os.path.join(self._model_dir, modes.TRAIN)
            )
            self._active_mode = modes.TRAIN
        self._configure_run_steps(dataloader, mode)
        with ExitStack() as self.__cleanup_stack:
            try:
                yield
            finally:
                for writer in self._writers.values():
                    writer.flush()
                    writer.close()
                self.__cleanup_stack = None

    # ------------------------------------------------------------------ hooks
    def on_checkpoint_saved(self, checkpoint_path: str, step: int):
        """Runs after a checkpoint is saved."""

    def on_train_start(self):
        """Runs before training starts."""

    def on_train_end(self, early_exit: bool):
        """Runs after training ends."""

    def on_eval_start(self):
        """Runs before eval starts."""

    def on_eval_end(self, early_exit: bool):
        """Runs after eval ends."""

    def on_train_epoch_start(self):
        """Runs before a training epoch."""

    def on_train_epoch_end(self, early_exit: bool):
        """Runs after a training epoch."""

    def on_eval_epoch_start(self):
        """Runs before an eval epoch."""

    def on_eval_epoch_end(self, early_exit: bool):
        """Runs after an eval epoch."""

    def on_train_batch_start(self, data):
        """Pre-processes a batch on the host before its step; returns the data."""
        return data

    def on_train_batch_end(self, loss, epoch: int = None, step: int = None):
        """After each training step (on the host): logging, loss checks and summaries,
        checkpointing."""
        self._maybe_write_log(loss)
        self._maybe_check_loss_value(loss)
        self._maybe_save_loss(loss)
        self._maybe_save_checkpoint()

    def on_eval_batch_start(self, data):
        """Pre-processes a batch on the host before its eval step; returns the data."""
        return data

    def on_eval_batch_end(self, loss, epoch: int = None, step: int = None):
        """After each eval step (on the host)."""
        eval_step = step + 1
        self._maybe_write_log(loss, step_offset=eval_step, base_step=0)
        self._maybe_check_loss_value(loss, step_offset=eval_step)
        self._accumulate_loss_value(loss)

    # ------------------------------------------------------------------ traced step parts
    def train_forward(self, data):
        """The train forward pass (traced: runs once, when the step is compiled)."""
        return self._model(data)

    def eval_forward(self, data):
        """The eval forward pass (traced: runs once, when the eval step is compiled)."""
        return self._model(data)

    def backward(self, loss):
        """The backward pass, loss-scaled when a scaler is configured (traced)."""
        if self._scaler:
            self._scaler.scale(loss).backward()
        else:
            loss.backward()

    def optimizer_zero_grad(self):
        """Zeroes the gradients (traced)."""
        self._optimizer.zero_grad()

    def optimizer_step(self):
        """Unscales, clips (``optimizer.gradient_clipper``) and steps (traced). With a
        dynamic loss scale, a step whose gradients overflow is skipped in the program."""
        if self._scaler:
            self._scaler.unscale_(self._optimizer)
        clipper = getattr(self._optimizer, "gradient_clipper", None)
        if clipper is not None:
            clipper([p for group in self._optimizer.param_groups for p in group["params"]])
        if self._scaler:
            self._scaler.step(self._optimizer)
            self._scaler.update()
        else:
            self._optimizer.step()

    def lr_scheduler_step(self):
        """Advances the LR scheduler (traced)."""
        if self._lr_scheduler:
            self._lr_scheduler.step()

    # ------------------------------------------------------------------ compiled steps
    def _get_train_step(self):
        """The traced training step (built once; compiled on its first call)."""
        if self._traced_train_step is None:

            @cstorch.trace
            def train_step(batches):
                self.optimizer_zero_grad()
                total = None
                for data in batches:
                    loss = self.train_forward(data)
                    self.backward(loss)
                    total = loss.detach() if total is None else total + loss.detach()
                self.optimizer_step()
                self.lr_scheduler_step()
                return total

            self._traced_train_step = train_step
        return self._traced_train_step

    def _get_eval_step(self):
        """The traced eval step (built once; compiled on its first call)."""
        if self._traced_eval_step is None:

            @cstorch.trace
            @torch.no_grad()
            def eval_step(batch):
                return extract_loss(self.eval_forward(batch))

            self._traced_eval_step = eval_step
        return self._traced_eval_step

    def _train_step(self, micro_batches):
        return self._get_train_step()(micro_batches)

    def _eval_step(self, data):
        return self._get_eval_step()(data)

    def _executor(self, dataloader, num_steps: int, group: int = 1):
        """A cstorch DataExecutor over ``num_steps`` groups of ``group`` batches: it runs the
        step closures of each step after the step, and fixes the run's length."""
        loader = cstorch.utils.data.DataLoader(lambda: _MicroBatchGroups(dataloader, group))
        return cstorch.utils.data.DataExecutor(loader, num_steps=num_steps)

    def _run_epoch(self, dataloader, num_steps, group, body):
        """Runs ``body(epoch_step, groups) -> exit_epoch`` for up to ``num_steps`` steps."""
        batches = iter(self._executor(dataloader, num_steps, group))
        exit_epoch = False
        for epoch_step, groups in enumerate(batches):
            exit_epoch = body(epoch_step, groups)
            if exit_epoch and epoch_step + 1 < num_steps:  # stopped early by _should_stop
                cstorch.backend.current_backend_impl().run_step_closures()
                batches.close()
                break
        return exit_epoch

    def _set_training(self, training: bool):
        """Puts the model in train or eval mode when that changes. (Every ``train()`` call
        selects a new compiled program, and on the modeled wafer a new program is an
        error, so an unchanged mode is not set again.)"""
        if getattr(self, "_model_training", None) is not training:
            if training:
                self._model.train()
            else:
                self._model.eval()
            self._model_training = training

    # ------------------------------------------------------------------ drivers
    def train(self, train_dataloader):
        """Trains the model on the batches of ``train_dataloader``."""
        self._train_dataloader = train_dataloader
        with self._configure_run(modes.TRAIN, train_dataloader):
            self.on_train_start()
            exit_training = False
            for epoch in range(self._num_epochs):
                exit_training = self.train_epoch(epoch, train_dataloader)
                if exit_training:
                    break
            self.on_train_end(exit_training)

    def train_epoch(self, epoch: int, dataloader) -> bool:
        """Runs one epoch of training; returns whether training is done."""
        self._active_mode = modes.TRAIN
        self.on_train_epoch_start()
        self._set_training(True)
        steps = min(self._train_steps_per_epoch, self._total_steps - self._run_step)
        exit_training = False

        def body(epoch_step, micro_batches):
            nonlocal exit_training
            micro_batches = [self.on_train_batch_start(data) for data in micro_batches]
            loss = self._train_step(micro_batches)
            self._increment_global_step()
            self.on_train_batch_end(loss, epoch, epoch_step)
            exit_epoch, exit_training = self._should_stop(epoch_step, modes.TRAIN)
            return exit_epoch

        exit_epoch = self._run_epoch(dataloader, steps, self._grad_accum_steps, body)
        self.on_train_epoch_end(exit_epoch)
        return exit_training

    def evaluate(self, eval_dataloader):
        """Evaluates the model on the batches of ``eval_dataloader``."""
        self._eval_dataloader = eval_dataloader
        with self._configure_run(modes.EVAL, eval_dataloader):
            self.on_eval_start()
            self.eval_epoch(eval_dataloader)
            self.on_eval_end(early_exit=False)

    def eval_epoch(self, dataloader, epoch: int = None):
        """Runs one epoch of evaluation, then computes and logs the metrics."""
        self._active_mode = modes.EVAL
        reset_all_metrics()
        self.on_eval_epoch_start()
        self._eval_losses = []
        self._set_training(False)

        def body(step, group):
            data = self.on_eval_batch_start(group[0])
            loss = self._eval_step(data)
            self.on_eval_batch_end(loss, epoch, step)
            return self._should_stop(step, modes.EVAL)[0]

        exit_epoch = self._run_epoch(dataloader, self._eval_steps_per_epoch, 1, body)
        self.on_eval_epoch_end(exit_epoch)
        self.compute_eval_metrics()

    def compute_eval_metrics(self):
        """Computes and logs the eval metrics."""
        self.print_eval_metrics(compute_all_metrics())

    def print_eval_metrics(self, eval_metrics):
        """Logs the eval metrics and the average eval loss (also to TensorBoard)."""
        step = self._global_step or 0
        if eval_metrics:
            if self._writer:
                for scope, value in visit_structure(
                    eval_metrics, lambda v: isinstance(v, (int, float)), strict=True
                ):
                    self._writer.add_scalar("/".join(scope), value, step)
            logging.info(f"Avg eval_metrics = {eval_metrics}")
        losses = [float(loss) for loss in self._eval_losses]
        self.avg_eval_loss = sum(losses) / len(losses) if losses else float("nan")
        if self._writer:
            self._writer.add_scalar("loss", self.avg_eval_loss, step)
        logging.info(f"Avg Eval. Loss = {self.avg_eval_loss}")

    def train_and_eval(self, train_dataloader, eval_dataloader):
        """Each epoch: trains, then evaluates (CPU/GPU; the modeled wafer refuses it)."""
        self._train_dataloader = train_dataloader
        self._eval_dataloader = eval_dataloader
        with self._configure_run(modes.TRAIN_AND_EVAL, (train_dataloader, eval_dataloader)):
            self.on_train_start()
            exit_training = False
            for epoch in range(self._num_epochs):
                exit_training = self.train_epoch(epoch, train_dataloader)
                self.eval_epoch(eval_dataloader, epoch)
                if exit_training:
                    break
            self.on_train_end(exit_training)
            logging.info("Training and Evaluation Completed Successfully!")

    def eval_all(self, eval_dataloader):
        """Evaluates every ``checkpoint_<step>.mdl`` in ``model_dir``, by increasing step."""
        from modelzoo.common.pytorch.utils import get_checkpoints

        if self._runconfig.get("checkpoint_path"):
            raise ValueError(
                "eval_all evaluates every checkpoint in model_dir; do not pass "
                "--checkpoint_path with it (use --mode eval for one checkpoint)."
            )
        checkpoints = get_checkpoints(self._model_dir)
        if not checkpoints:
            raise ValueError(
                f"No checkpoints (checkpoint_<step>.mdl) found in {self._model_dir} to evaluate."
            )
        results = {}
        for path in checkpoints:
            self._checkpoint_path = path
            self.evaluate(eval_dataloader)
            results[path] = self.avg_eval_loss
        return results

    # ------------------------------------------------------------------ abstract parts
    @abc.abstractmethod
    def _increment_global_step(self):
        raise NotImplementedError()

    @abc.abstractmethod
    def _write_log(self, loss, global_step):
        raise NotImplementedError()

    @abc.abstractmethod
    def _save_checkpoint(self, step):
        raise NotImplementedError()

    # ------------------------------------------------------------------ the "maybe" steps
    def _maybe_write_log(self, loss, step_offset=0, base_step=None):
        if self._is_fetch_step(step_offset):
            base_step = self._global_step if base_step is None else base_step
            self._write_log(loss, base_step + step_offset)

    def _maybe_save_loss(self, loss, epoch=None, step_offset=0):
        if self._save_losses and self._is_fetch_step(step_offset) and self._writer:
            self._writer.add_scalar("loss", float(loss), self._global_step + step_offset)

    def _maybe_save_checkpoint(self, step_offset=0):
        if self._is_checkpoint_step(step_offset):
            self._save_checkpoint(self._global_step)

    def _maybe_check_loss_value(self, loss, step_offset=0):
        if self._check_loss_values and self._is_fetch_step(step_offset):
            self._check_loss_value(loss)

    def _check_loss_value(self, loss: torch.Tensor):
        value = float(loss)
        if math.isnan(value):
            raise ValueError(
                "NaN loss detected. Please try different hyperparameters such as "
                "the learning rate, batch size, etc."
            )
        if math.isinf(value):
            raise ValueError("inf loss detected.")

    def _accumulate_loss_value(self, loss: torch.Tensor):
        self._eval_losses.append(loss)

    def _maybe_load_checkpoint(self, checkpoint_path: Optional[str], mode: str):
        """Loads ``checkpoint_path`` (if any) into the model; sets the global step."""
        state_dict = None
        if checkpoint_path:
            if not os.path.exists(checkpoint_path):
                raise FileNotFoundError(
                    f"Checkpoint {checkpoint_path} does not exist. Check "
                    "--checkpoint_path (or runconfig.checkpoint_path)."
                )
            logging.info(f"Loading weights from checkpoint {checkpoint_path}")
            state_dict = cstorch.load(checkpoint_path)
            self._model.set_state(state_dict)
        else:
            logging.info(
                "No checkpoint was provided, model parameters will be initialized randomly"
            )
        if state_dict and not self._is_pretrained_checkpoint:
            self._global_step = int(state_dict.get("global_step", 0))
        else:
            self._global_step = 0
        self._initial_step = self._global_step
        return state_dict

    def _get_last_checkpoint(self):
        """The ``checkpoint_<step>.mdl`` with the highest step in ``model_dir``, or None."""
        checkpoints = get_checkpoints(self._model_dir)
        if not checkpoints:
            return None
        logging.info(
            f"Found latest checkpoint at {checkpoints[-1]}. This checkpoint will be "
            "used for loading model state."
        )
        return checkpoints[-1]

    def _checkpoint_state(self, step: int) -> dict:
        state = self._model.get_state()
        state["global_step"] = step
        return state

    def _write_checkpoint(self, step: int) -> str:
        path = os.path.join(self._model_dir, f"checkpoint_{step}.mdl")
        logging.info(f"Saving checkpoint at step : {step}.")
        # A rerun from an earlier checkpoint rewrites later steps: cstorch.save replaces the
        # old file atomically (a crash keeps the old checkpoint or the new one).
        cstorch.save(self._checkpoint_state(step), path)
        self.on_checkpoint_saved(path, step)
        return path

    # ------------------------------------------------------------------ create
    @staticmethod
    def create(model_fn, params: dict, runner_cls=None) -> "PyTorchBaseRunner":
        """The runner for the params' target: ``PyTorchCSCompiler`` for ``compile_only`` /
        ``validate_only``, ``PyTorchCSAppliance`` for CSX (the modeled wafer),
        ``PyTorchDistRunner`` for GPU with ``enable_distributed``, else ``PyTorchRunner``.

        ``runner_cls`` substitutes a custom runner (a subclass of the class that would be
        chosen, e.g. ``class MyRunner(PyTorchRunner)``), built with the same arguments; this
        is how a custom runner is used without editing ``create``
        (``run(..., runner_cls=MyRunner)`` passes it through).

        The choice is ``runner_factory.create_runner``, which registers itself here when the
        package loads: this base class does not import the runners built on it.
        """
        if _runner_factory is None:  # pragma: no cover - the package __init__ registers it
            raise RuntimeError("modelzoo.common.pytorch.runner_factory was not loaded.")
        return _runner_factory(model_fn, params, runner_cls)


_runner_factory = None  # runner_factory.create_runner (see PyTorchBaseRunner.create)


def register_runner_factory(factory) -> None:
    """Called by ``runner_factory``: the function ``PyTorchBaseRunner.create`` delegates to."""
    global _runner_factory
    _runner_factory = factory
