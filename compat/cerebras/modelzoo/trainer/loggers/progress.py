"""Console progress: a progress bar with loss and rate on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
import weakref

import torch

from cerebras.modelzoo.trainer.loggers.logger import Logger


def _number(value):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None
        value = value.float().item()
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class ProgressLogger(Logger):
    """Shows the step, the loss and the rate (samples/s) of the running loop.

    On a terminal it redraws one progress bar per loop; when output goes to a file or pipe it
    prints one line per logged step (no control characters in logs).
    """

    BAR_WIDTH = 24

    def __init__(self, stream=None):
        self.stream = stream
        self._trainer = lambda: None
        self._start = None
        self._samples = 0
        self._steps = 0

    @property
    def _out(self):
        return self.stream if self.stream is not None else sys.stdout

    @property
    def _interactive(self) -> bool:
        isatty = getattr(self._out, "isatty", None)
        return bool(isatty and isatty())

    def setup(self, trainer):
        self._trainer = weakref.ref(trainer)  # the trainer's finalizer keeps its callbacks alive

    def _bar(self) -> str:
        trainer = self._trainer()
        executor = None if trainer is None else trainer.executor
        if executor is None:
            return ""
        done, total = executor.user_iteration, executor.num_steps
        filled = self.BAR_WIDTH * done // total
        return f"[{'=' * filled}{' ' * (self.BAR_WIDTH - filled)}] {done}/{total} "

    def _reset(self):
        self._start, self._samples, self._steps = time.perf_counter(), 0, 0

    def on_train_start(self, trainer, model, train_dataloader, loop, loop_idx):
        self._reset()

    def on_validate_start(self, trainer, model, val_dataloader, loop):
        self._reset()

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        self._count(batch)

    def on_validate_batch_end(self, trainer, model, outputs, batch, batch_idx):
        self._count(batch)

    def _count(self, batch):
        leaves = torch.utils._pytree.tree_leaves(batch)
        sizes = [t.shape[0] for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0]
        self._samples += sizes[0] if sizes else 0
        self._steps += 1

    def _end_line(self):
        if self._interactive:
            self._out.write("\n")
            self._out.flush()

    def on_train_end(self, trainer, model, loop, loop_idx):
        self._end_line()

    def on_validate_end(self, trainer, model, loop):
        self._end_line()

    @property
    def rate(self) -> float:
        elapsed = time.perf_counter() - self._start if self._start is not None else 0.0
        return self._samples / elapsed if elapsed > 0 else 0.0

    def log_metrics(self, metrics, step):
        # One line per logged loss (other metrics belong in TensorBoard), with the rate.
        parts = [f"{name}={number:.5g}" for name, number in
                 ((n, _number(v)) for n, v in metrics.items() if n.split("/")[-1] == "loss")
                 if number is not None]
        if not parts:
            return
        line = f"step {step} | " + ", ".join(parts) + f" | {self.rate:.1f} samples/s"
        if self._interactive:
            self._out.write("\r\033[K" + self._bar() + line)
        else:
            self._out.write(line + "\n")
        self._out.flush()
