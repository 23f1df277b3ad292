"""Python logging of the run, its text log file, and which steps are log steps.

While a fit or validation runs, the trainer's log records (and the progress lines of
``ProgressLogger``) also go to ``<model_dir>/cerebras_logs/<timestamp>/run.log``
(``cerebras_logs/latest/run.log`` is the newest run's), as the Model Zoo keeps its run log.
"""

from __future__ import annotations

import logging as _logging

from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Logging(CoreCallback):
    """``Logging(log_steps=1, log_level="INFO")``: metrics are logged on every ``log_steps``-th
    step (and the last step of a fit or validation); ``enable_act_frequency`` also fetches step
    outputs only on those steps. ``log_steps=0`` logs nothing."""

    def __init__(
        self, log_steps=1, log_level="INFO", wsc_log_level=None, enable_act_frequency=False
    ):
        if log_steps is not None and (
            isinstance(log_steps, bool) or not isinstance(log_steps, int) or log_steps < 0
        ):
            raise ValueError(f"log_steps must be a non-negative integer, got {log_steps!r}.")
        if isinstance(log_level, str):
            if log_level.upper() not in _LEVELS:
                raise ValueError(
                    f"log_level must be one of {', '.join(_LEVELS)}, got {log_level!r}."
                )
            log_level = getattr(_logging, log_level.upper())
        elif not isinstance(log_level, int):
            raise ValueError(f"log_level must be a level name or number, got {log_level!r}.")
        self.log_steps = log_steps
        self.log_level = log_level
        self.wsc_log_level = wsc_log_level  # appliance logging; nothing to configure here
        self.enable_act_frequency = enable_act_frequency
        self.logger = _logging.getLogger("cerebras.modelzoo.trainer")
        self.log_file = None  # <artifact_dir>/run.log, set at setup
        self._file_handler = None

    def pre_setup(self, trainer):
        self.logger.setLevel(self.log_level)
        if not _logging.getLogger().handlers and not self.logger.handlers:
            handler = _logging.StreamHandler()
            handler.setFormatter(_logging.Formatter("%(asctime)s %(levelname)s: %(message)s"))
            self.logger.addHandler(handler)

    def setup(self, trainer):
        if self.enable_act_frequency and self.log_steps:
            trainer.activation_steps = self.log_steps
        if trainer.artifact_dir is not None:
            self.log_file = trainer.artifact_dir / "run.log"

    def _write_log_file(self, stack):
        """Sends the trainer's records (and the progress lines) to ``run.log`` until the
        fit or validation ends (a nested validation shares its fit's handler)."""
        if self.log_file is None or self._file_handler is not None:
            return
        handler = _logging.FileHandler(self.log_file, encoding="utf-8")
        handler.setFormatter(_logging.Formatter("%(asctime)s %(levelname)s: %(message)s"))
        handler.setLevel(self.log_level)
        loggers = [self.logger, progress_log()]
        for logger in loggers:
            logger.addHandler(handler)
        self._file_handler = handler

        def close():
            for logger in loggers:
                logger.removeHandler(handler)
            handler.close()
            self._file_handler = None

        stack.callback(close)

    def on_enter_fit(self, trainer, stack, train_dataloader, val_dataloader, loop):
        self._write_log_file(stack)

    def on_enter_validate_all(self, trainer, stack, val_dataloaders, loop, ckpt_paths):
        self._write_log_file(stack)

    def on_fit_start(self, trainer, train_dataloader, val_dataloader, loop):
        self._fit_start = (trainer.global_step, getattr(loop, "total_steps", None))

    def on_train_start(self, trainer, model, train_dataloader, loop, loop_idx):
        self._training = True

    def on_enter_validate(self, trainer, stack, val_dataloader, loop):
        self._training = False
        self._write_log_file(stack)

    _training = False
    _fit_start = (0, None)

    def is_log_step(self, trainer) -> bool:
        """Training: every ``log_steps``-th step of the fit (counted across its training
        loops) and its last step. Validation: every ``log_steps``-th batch and the last."""
        if not self.log_steps:
            return False
        if self._training:
            initial, total = self._fit_start
            fit_step = trainer.global_step - initial
            return fit_step % self.log_steps == 0 or (total is not None and fit_step >= total)
        executor = trainer.executor
        if executor is None:
            return False
        return executor.user_iteration % self.log_steps == 0 or executor.on_final_iteration


def progress_log() -> _logging.Logger:
    """Where ``ProgressLogger`` writes its lines for the run log: only the run-log file
    handler listens (they are shown on the console by the ProgressLogger itself)."""
    logger = _logging.getLogger("cerebras.modelzoo.trainer.progress")
    logger.propagate = False
    logger.setLevel(_logging.INFO)
    return logger
