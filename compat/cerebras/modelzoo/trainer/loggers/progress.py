"""Console progress, the way Lightning and the HF Trainer show a run, in the format of a
plain loop's (``cstorch.utils.progress``):

* a run header (device, precision, parameter count, steps, batch);
* "compiling the training step..." while the first step captures and compiles, then the first
  step's line with its time;
* on a terminal, one bar for the whole fit, counted in global steps (``train [====>   ]
  120/200``), with the loss, the steady-state rate and the time left; validation redraws it
  as ``validate``; when output goes to a file or pipe, a plain line every twentieth of the fit
  or every 30 s, whichever comes first (``CSTORCH_PROGRESS_EVERY``,
  ``CSTORCH_PROGRESS_SECONDS``), independent of ``log_steps``;
* log records and warnings printed while the bar is shown appear on their own lines (the bar
  is cleared first and redrawn after);
* each validation's result on its own line, and an end-of-run summary.

The rate is "steady": samples per second over the steps after the first step of each loop, so
neither compilation nor the start of a loop is counted (RateProfiler measures the same way).
Every line also goes to the run's ``run.log`` (see ``callbacks.logging``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import warnings
import weakref

import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.logging import progress_log
from cerebras.modelzoo.trainer.loggers.logger import Logger
from cstorch.utils import progress as _progress


def _number(value):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None
        value = value.float().item()
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _batch_size(batch) -> int:
    for leaf in torch.utils._pytree.tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return leaf.shape[0]
    return 0


class ProgressLogger(Logger):
    """Shows the run: header, compile time, global step of total with ETA, loss, steady-state
    rate, validation results and a summary (see the module docstring)."""

    def __init__(self, stream=None):
        self.stream = stream
        self._trainer = lambda: None
        self._kind = "train"
        self._fit = None  # (global step when the fit started, steps the fit runs)
        self._progress = {}  # kind -> the RunProgress of the running fit or validation
        self._compile_seconds = {}  # kind -> seconds of the step that compiled it
        self._compiling = False
        self._announce = False  # "compiling ..." is due at the loop's first batch
        self._header_due = False
        self._losses = {}  # the newest value of every logged loss, by name
        self._run_start = None
        self._running = 0  # nesting of fit / validate

    # ------------------------------------------------------------------------- output
    @property
    def _out(self):
        return self.stream if self.stream is not None else sys.stdout

    @property
    def _interactive(self) -> bool:
        return _progress.mode(None, self._out, any_length=True) == "bar"

    @property
    def _display(self) -> str:
        return _progress.mode(None, self._out, any_length=True)

    @property
    def _current(self):
        return self._progress.get(self._kind)

    def _line(self, text: str) -> None:
        """A permanent line (above the bar on a terminal), also written to the run log."""
        current = self._current
        if self._display != "off":
            if current is not None:
                current.write(text)
            else:
                self._out.write(text + "\n")
                self._out.flush()
        progress_log().info(text)

    def _end_bar(self) -> None:
        for progress in self._progress.values():
            progress.close()

    @contextlib.contextmanager
    def _bar_safe_output(self):
        """Log records and warnings printed to the terminal while the bar is drawn get their
        own lines: the bar is cleared before and redrawn after."""
        if not self._interactive:
            yield
            return
        handlers = []
        for logger in (logging.getLogger(), logging.getLogger("cerebras.modelzoo.trainer")):
            handlers += [
                h
                for h in logger.handlers
                if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)
                and h not in handlers
            ]
        patched = []
        for handler in handlers:
            emit = handler.emit
            handler.emit = self._around_bar(emit)
            patched.append(handler)
        showwarning = warnings.showwarning
        warnings.showwarning = self._around_bar(showwarning)
        try:
            yield
        finally:
            warnings.showwarning = showwarning
            for handler in patched:
                del handler.emit  # back to the class's method

    def _around_bar(self, write):
        def wrapped(*args, **kwargs):
            current = self._current
            with current.printing() if current is not None else contextlib.nullcontext():
                return write(*args, **kwargs)

        return wrapped

    # -------------------------------------------------------------------------- hooks
    def setup(self, trainer):
        self._trainer = weakref.ref(trainer)  # the trainer's finalizer keeps its callbacks alive

    def _enter(self, stack):
        if self._running == 0:
            self._run_start = time.perf_counter()
            self._losses = {}
            self._progress = {}
            self._compile_seconds = {}
            stack.enter_context(self._bar_safe_output())
        self._running += 1
        stack.callback(self._leave)

    def _leave(self):
        self._running -= 1

    def on_enter_fit(self, trainer, stack, train_dataloader, val_dataloader, loop):
        self._enter(stack)

    def on_enter_validate(self, trainer, stack, val_dataloader, loop):
        self._enter(stack)

    def on_fit_start(self, trainer, train_dataloader, val_dataloader, loop):
        self._fit = (trainer.global_step, getattr(loop, "total_steps", None))
        self._header_due = True

    def on_fit_end(self, trainer, loop):
        self._end_bar()
        self._summary(trainer, "fit")
        self._fit = None

    def on_train_start(self, trainer, model, train_dataloader, loop, loop_idx):
        self._start_loop(trainer, "train", not trainer.training_step.programs)

    def on_train_end(self, trainer, model, loop, loop_idx):
        progress = self._progress.get("train")
        if progress is not None:
            progress.pause()  # what follows (a validation) is not training time

    def on_validate_start(self, trainer, model, val_dataloader, loop):
        step = trainer._validation_steps.get(getattr(loop, "hook", "validate"))
        self._start_loop(trainer, "validate", step is None or not step.programs)

    def on_validate_end(self, trainer, model, loop):
        progress = self._progress.pop("validate", None)
        if progress is not None:
            progress.clear()
        if self._fit is None:  # a validation on its own: it ends the run
            self._kind = "validate"
            self._summary(trainer, "validate")
        self._kind = "train"
        if "train" in self._progress:
            self._progress["train"].restore()  # the fit's bar again

    def _start_loop(self, trainer, kind: str, compiles: bool) -> None:
        if kind == "validate" and "train" in self._progress:
            self._progress["train"].clear()  # the validation's bar takes its place
        self._kind = kind
        progress = self._progress.get(kind)
        if progress is None or kind == "validate":
            if kind == "train" and self._fit is not None and self._fit[1]:
                start, steps = self._fit
                total, first = start + steps, start
            else:
                executor = trainer.executor
                total, first = (executor.num_steps if executor is not None else None), 0
            display = self._display
            if kind == "validate" and display == "lines":
                display = "off"  # off a terminal a validation shows its result line only
            progress = _progress.RunProgress(
                total, label=kind, stream=self._out, display=display, first=first
            )
            progress.compiles = compiles
            self._progress[kind] = progress
        self._compiling = compiles
        self._announce = compiles  # said at the loop's first batch, after the run header

    def _announce_compile(self) -> None:
        if self._header_due or not self._announce:
            return
        self._announce = False
        progress, kind = self._current, self._kind
        if progress is not None:
            what = "training" if kind == "train" else "validation"
            message = f"compiling the {what} step (capture and XLA compile)..."
            if progress.display == "bar":
                progress.show_status(message)
                progress_log().info(message)
            else:
                self._line(message)

    def on_train_batch_start(self, trainer, model, batch, batch_idx):
        if self._header_due:
            self._header_due = False
            self._line(self._header(trainer, _batch_size(batch)))
        self._announce_compile()

    def on_validate_batch_start(self, trainer, model, batch, batch_idx):
        if self._fit is None:
            self._header_due = False  # a validation on its own has no training header
        self._announce_compile()

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        self._step_done(trainer, outputs, batch)

    def on_validate_batch_end(self, trainer, model, outputs, batch, batch_idx):
        self._step_done(trainer, outputs, batch)

    def _step_done(self, trainer, outputs, batch):
        # Passing the loss makes the closure run once the step's values exist, so the clock
        # measures the step, not its asynchronous dispatch: only on steps that are shown (and
        # log steps, where the loss is fetched anyway).
        progress = self._current
        if progress is None:
            return
        done, total = self._position(trainer)
        if progress.total is None:
            progress.total = total or None
        shown = progress.due(done) or self._compiling
        loss = outputs.get("loss") if isinstance(outputs, dict) else None
        fetch = shown or trainer.is_log_step
        self._tick(trainer, progress, done, shown, _batch_size(batch), loss if fetch else None)

    @cstorch.step_closure
    def _tick(self, trainer, progress, done, shown, count, loss):
        number = _number(loss) if loss is not None else None
        if number is not None and progress.label == "train":
            self._losses["loss"] = number
        was_compiling = self._compiling
        if was_compiling:
            progress.clear()  # the "compiling" status
        progress.step(done, count, loss=number if progress.label == "train" else None, shown=False)
        if was_compiling:
            self._compiling = False
            self._compile_seconds[progress.label] = progress.first_step_seconds
        if shown and progress.active:
            text = progress.text(number if progress.label == "train" else None)
            if progress.display == "bar":
                progress._draw(text)
                if was_compiling:
                    progress_log().info(text)
            else:
                self._line(text)

    def _position(self, trainer):
        """(done, total) of the running loop: global steps of the fit when training."""
        executor = trainer.executor
        if self._kind == "train" and self._fit is not None and self._fit[1]:
            start, steps = self._fit
            return trainer.global_step, start + steps
        if executor is None:
            return 0, 0
        return executor.user_iteration, executor.num_steps

    def _header(self, trainer, batch) -> str:
        parameters = (
            sum(p.numel() for p in trainer.model.parameters())
            if trainer.model is not None
            else None
        )
        steps = self._fit[1] if self._fit is not None else None
        return _progress.run_header(trainer.backend._impl, parameters, steps, batch)

    def log_metrics(self, metrics, step):
        # Training losses show in the step's line; a validation's loss is its result line.
        for name, value in metrics.items():
            number = _number(value)
            if number is None or name.split("/")[-1] != "loss":
                continue
            if "/" in name:  # a validation (name-scoped: validate_0/loss)
                self._losses[name] = number
                self._line(f"step {step} | {name} {_progress.format_loss(number)}")
            else:
                self._losses[name] = number

    # ------------------------------------------------------------------------ summary
    def _summary(self, trainer, what: str) -> None:
        seconds = time.perf_counter() - self._run_start if self._run_start else 0.0
        parts = [
            f"{what} done at global step {trainer.global_step} in "
            f"{_progress.format_duration(seconds)}"
        ]
        compiled = sum(self._compile_seconds.values())
        if compiled:
            parts.append(f"compiling {compiled:.1f} s")
        train = self._progress.get("train")
        rate = train.steady_rate() if train is not None else None
        if rate:
            parts.append(f"training {rate:,.1f} samples/s")
        parts += [f"{name} {_progress.format_loss(value)}" for name, value in self._losses.items()]
        log_file = getattr(getattr(trainer, "logging", None), "log_file", None)
        if log_file is not None:
            parts.append(f"log {log_file}")
        self._line(" | ".join(parts))
