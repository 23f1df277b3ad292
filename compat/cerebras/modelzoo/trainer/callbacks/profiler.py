"""Measures the training and validation rate (samples per second) seen by the client."""

from __future__ import annotations

import time

import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import Callback


class RateProfiler(Callback):
    """``rate`` (samples/s over the last step) and ``global_rate`` (since the loop's first
    step finished, so compilation is not counted); logs ``avg_samples_per_sec`` and
    ``rate``."""

    def __init__(self):
        self.total_count = 0
        self._start = None
        self._last = None
        self.rate = 0.0
        self.global_rate = 0.0

    def _reset(self):
        self.total_count, self._start, self._last = 0, None, None
        self.rate = self.global_rate = 0.0

    def on_train_start(self, trainer, model, train_dataloader, loop, loop_idx):
        self._reset()

    def on_validate_start(self, trainer, model, val_dataloader, loop):
        self._reset()

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        self._update(trainer, _batch_size(batch))

    def on_validate_batch_end(self, trainer, model, outputs, batch, batch_idx):
        self._update(trainer, _batch_size(batch))

    @cstorch.step_closure
    def _update(self, trainer, count):
        now = time.perf_counter()
        if self._start is None:  # the first step includes compilation: start timing after it
            self._start = self._last = now
            return
        self.total_count += count
        elapsed = now - self._last
        self.rate = count / elapsed if elapsed > 0 else 0.0
        total = now - self._start
        self.global_rate = self.total_count / total if total > 0 else 0.0
        self._last = now
        trainer.log_metrics(avg_samples_per_sec=self.global_rate, rate=self.rate)


def _batch_size(batch) -> int:
    for leaf in torch.utils._pytree.tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return leaf.shape[0]
    return 0
