"""TensorBoard event files, written with torch's ``SummaryWriter`` (the tensorboard package)."""

from __future__ import annotations

import numbers
import weakref

import torch

from cerebras.modelzoo.trainer.loggers.logger import Logger


class TensorBoardLogger(Logger):
    """Writes scalar metrics as scalars, other tensors as histograms, strings as text, into
    ``summary_dir`` (default: the trainer's summary directory). TensorBoard reads the files.

    ``legacy_event_dirs=True`` writes training and each validation into their own
    subdirectories (``train/``, ``validate_0/``) without name-scope prefixes on the tags.
    """

    def __init__(self, summary_dir=None, legacy_event_dirs=False):
        self.summary_dir = summary_dir
        self.legacy_event_dirs = legacy_event_dirs
        self._writers = {}
        self._trainer = lambda: None

    def setup(self, trainer):
        self._trainer = weakref.ref(trainer)  # the trainer's finalizer keeps its callbacks alive
        if self.summary_dir is None:
            self.summary_dir = trainer.summary_dir

    def _writer(self, subdir=""):
        from torch.utils.tensorboard import SummaryWriter

        if subdir not in self._writers:
            path = f"{self.summary_dir}/{subdir}" if subdir else str(self.summary_dir)
            self._writers[subdir] = SummaryWriter(log_dir=path)
        return self._writers[subdir]

    def log_metrics(self, metrics, step):
        subdir = ""
        trainer = self._trainer()
        if self.legacy_event_dirs and trainer is not None:
            scopes = trainer._name_scope_stack
            subdir = scopes[-1] if scopes else "train"
        writer = self._writer(subdir)
        for name, value in metrics.items():
            if isinstance(value, torch.Tensor):
                value = value.detach()
                if value.numel() == 1:
                    writer.add_scalar(name, value.float().item(), step)
                else:
                    writer.add_histogram(name, value.float(), step)
            elif isinstance(value, bool):
                writer.add_scalar(name, float(value), step)
            elif isinstance(value, numbers.Number):
                writer.add_scalar(name, float(value), step)
            elif isinstance(value, str):
                writer.add_text(name, value, step)
            else:
                raise TypeError(
                    f"TensorBoardLogger cannot log {name}={type(value).__name__}: log numbers, "
                    "tensors or strings."
                )

    def flush(self):
        for writer in self._writers.values():
            writer.flush()

    def on_fit_end(self, trainer, loop):
        self.flush()

    def on_validate_end(self, trainer, model, loop):
        self.flush()

    def finalize(self):
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
