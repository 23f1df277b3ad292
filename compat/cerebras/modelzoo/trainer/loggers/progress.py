"""Console progress, the way Lightning and the HF Trainer show a run.

* a "compiling the training step..." line while the first step captures and compiles, then its
  time;
* on a terminal, one bar for the whole fit, counted in global steps (``train [====>   ]
  120/200``), with the loss, the steady-state rate and the time left; validation redraws it
  as ``validate``; when output goes to a file or pipe, one plain line per log step instead;
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


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class _Clock:
    """Steady-state timing of one kind of loop (training or validation)."""

    def __init__(self):
        self.samples = 0
        self.steps = 0
        self.seconds = 0.0
        self.last = None  # the end of the previous step of the running loop

    @property
    def rate(self) -> float | None:
        return self.samples / self.seconds if self.seconds > 0 else None

    @property
    def step_seconds(self) -> float | None:
        return self.seconds / self.steps if self.steps else None


class ProgressLogger(Logger):
    """Shows the run: compile time, global step of total with ETA, loss, steady-state rate,
    validation results and a summary (see the module docstring)."""

    BAR_WIDTH = 24

    def __init__(self, stream=None):
        self.stream = stream
        self._trainer = lambda: None
        self._kind = "train"
        self._fit = None  # (global step when the fit started, steps the fit runs)
        self._clocks = {"train": _Clock(), "validate": _Clock()}
        self._compile_seconds = {}  # kind -> seconds of the step that compiled it
        self._loop_start = None
        self._first_step = False
        self._compiling = False
        self._losses = {}  # the newest value of every logged loss, by name
        self._bar = ""  # the bar as last drawn ("" when none is shown)
        self._run_start = None
        self._running = 0  # nesting of fit / validate

    # ------------------------------------------------------------------------- output
    @property
    def _out(self):
        return self.stream if self.stream is not None else sys.stdout

    @property
    def _interactive(self) -> bool:
        isatty = getattr(self._out, "isatty", None)
        return bool(isatty and isatty())

    def _line(self, text: str) -> None:
        """A permanent line (above the bar on a terminal), also written to the run log."""
        bar = self._bar
        self._clear_bar()
        self._out.write(text + "\n")
        if bar:
            self._draw(bar)
        self._out.flush()
        progress_log().info(text)

    def _draw(self, bar: str) -> None:
        self._out.write("\r\033[K" + bar)
        self._out.flush()
        self._bar = bar

    def _clear_bar(self) -> None:
        if self._bar:
            self._out.write("\r\033[K")
            self._out.flush()
            self._bar = ""

    def _end_bar(self) -> None:
        if self._bar:
            self._out.write("\n")
            self._out.flush()
            self._bar = ""

    @contextlib.contextmanager
    def _bar_safe_output(self):
        """Log records and warnings printed to the terminal while the bar is drawn get their
        own lines: the bar is cleared before and redrawn after."""
        if not self._interactive:
            yield
            return
        handlers = []
        for logger in (logging.getLogger(), logging.getLogger("cerebras.modelzoo.trainer")):
            handlers += [h for h in logger.handlers if isinstance(h, logging.StreamHandler)
                         and not isinstance(h, logging.FileHandler) and h not in handlers]
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
            bar = self._bar
            self._clear_bar()
            try:
                return write(*args, **kwargs)
            finally:
                if bar:
                    self._draw(bar)

        return wrapped

    # -------------------------------------------------------------------------- hooks
    def setup(self, trainer):
        self._trainer = weakref.ref(trainer)  # the trainer's finalizer keeps its callbacks alive

    def _enter(self, stack):
        if self._running == 0:
            self._run_start = time.perf_counter()
            self._losses = {}
            self._clocks = {"train": _Clock(), "validate": _Clock()}
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

    def on_fit_end(self, trainer, loop):
        self._end_bar()
        self._summary(trainer, "fit")
        self._fit = None

    def on_train_start(self, trainer, model, train_dataloader, loop, loop_idx):
        self._start_loop("train", not trainer.training_step.programs)

    def on_validate_start(self, trainer, model, val_dataloader, loop):
        step = trainer._validation_steps.get(getattr(loop, "hook", "validate"))
        self._start_loop("validate", step is None or not step.programs)

    def on_validate_end(self, trainer, model, loop):
        if self._fit is None:  # a validation on its own: it ends the run
            self._end_bar()
            self._summary(trainer, "validate")

    def _start_loop(self, kind: str, compiles: bool) -> None:
        self._kind = kind
        self._loop_start = time.perf_counter()
        self._first_step = True
        self._clocks[kind].last = None
        self._compiling = compiles
        if compiles:
            what = "training" if kind == "train" else "validation"
            message = f"compiling the {what} step (capture and XLA compile)..."
            if self._interactive:
                self._draw(message)
            else:
                self._line(message)

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        self._step_done(trainer, outputs, batch)

    def on_validate_batch_end(self, trainer, model, outputs, batch, batch_idx):
        self._step_done(trainer, outputs, batch)

    def _step_done(self, trainer, outputs, batch):
        # Passing the loss makes the closure run once the step's values exist, so the clock
        # measures the step, not its asynchronous dispatch; only on log steps (the loss is
        # fetched then anyway) or while timing the compile.
        loss = outputs.get("loss") if isinstance(outputs, dict) else None
        fetch = self._first_step or trainer.is_log_step or self._interactive
        self._tick(trainer, _batch_size(batch), loss if fetch else None)

    @cstorch.step_closure
    def _tick(self, trainer, count, loss):
        now = time.perf_counter()
        clock = self._clocks[self._kind]
        if self._first_step:
            self._first_step = False
            if self._compiling:
                self._compiling = False
                seconds = now - self._loop_start
                self._compile_seconds[self._kind] = seconds
                what = "training" if self._kind == "train" else "validation"
                if self._interactive:
                    self._clear_bar()
                self._line(f"compiled the {what} step in {seconds:.1f} s (its first step)")
        elif clock.last is not None:
            clock.samples += count
            clock.steps += 1
            clock.seconds += now - clock.last
        clock.last = now
        number = _number(loss) if loss is not None else None
        if number is not None and self._kind == "train":
            self._losses["loss"] = number
        self._show_step(trainer)

    def _position(self, trainer):
        """(done, total) of the running loop: global steps of the fit when training."""
        executor = trainer.executor
        if self._kind == "train" and self._fit is not None and self._fit[1]:
            start, steps = self._fit
            return trainer.global_step, start + steps
        if executor is None:
            return 0, 0
        return executor.user_iteration, executor.num_steps

    def _show_step(self, trainer):
        done, total = self._position(trainer)
        clock = self._clocks[self._kind]
        parts = [f"{self._kind} step {done}/{total}" if not self._interactive else
                 f"{self._kind} [{self._bar_fill(done, total)}] {done}/{total}"]
        if self._kind == "train" and "loss" in self._losses:
            parts.append(f"loss {self._losses['loss']:.4g}")
        if clock.rate is not None:
            parts.append(f"{clock.rate:,.1f} samples/s (steady)")
        if clock.step_seconds is not None and total > done:
            parts.append(f"ETA {_duration(clock.step_seconds * (total - done))}")
        text = " | ".join(parts)
        if self._interactive:
            self._draw(text)
        elif self._kind == "train" and trainer.is_log_step:
            self._line(text)

    def _bar_fill(self, done, total) -> str:
        filled = self.BAR_WIDTH * done // total if total else 0
        return "=" * filled + " " * (self.BAR_WIDTH - filled)

    def log_metrics(self, metrics, step):
        # Training losses show in the step's line; a validation's loss is its result line.
        for name, value in metrics.items():
            number = _number(value)
            if number is None or name.split("/")[-1] != "loss":
                continue
            if "/" in name:  # a validation (name-scoped: validate_0/loss)
                self._losses[name] = number
                self._line(f"step {step} | {name} {number:.5g}")
            else:
                self._losses[name] = number

    # ------------------------------------------------------------------------ summary
    def _summary(self, trainer, what: str) -> None:
        seconds = time.perf_counter() - self._run_start if self._run_start else 0.0
        parts = [f"{what} done at global step {trainer.global_step} in {_duration(seconds)}"]
        compiled = sum(self._compile_seconds.values())
        if compiled:
            parts.append(f"compiling {compiled:.1f} s")
        for kind, clock in self._clocks.items():
            if clock.rate is not None:
                parts.append(f"{'training' if kind == 'train' else 'validation'} "
                             f"{clock.rate:,.1f} samples/s (steady)")
        parts += [f"{name} {value:.5g}" for name, value in self._losses.items()]
        log_file = getattr(getattr(trainer, "logging", None), "log_file", None)
        if log_file is not None:
            parts.append(f"log {log_file}")
        self._line(" | ".join(parts))
