"""Loop callbacks: how many steps a fit or validation runs, and the global step.

A fit of ``total_steps`` is split into training loops of ``eval_frequency`` steps (the last
one may be shorter), each followed by validation. Every training loop runs one data executor
whose checkpoint steps fall on multiples of ``Checkpoint(steps=...)`` counted from the start
of the fit, plus the last step of the fit.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from cerebras.pytorch.utils.data import Schedule

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback

MAX_CSX_STEPS = (1 << 31) - 1


def _check_steps(name, value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an integer in the loop config, got {value!r}.")
    if value <= 0:
        raise ValueError(f"`{name}` must be greater than 0 in the loop config, got {value}.")
    if cstorch.use_cs() and value > MAX_CSX_STEPS:
        raise ValueError(f"`{name}` must be at most {MAX_CSX_STEPS} for CSX runs, got {value}.")


class LoopCallback(CoreCallback, ABC):
    """Owns ``trainer.global_step``: 0 at setup, +1 after each step that ran the optimizer."""

    @abstractmethod
    def __init__(self):
        """Subclasses configure the loop."""

    def setup(self, trainer):
        trainer.global_step = 0

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        if trainer.should_run_optimizer_step:
            trainer.global_step += 1

    def on_save_checkpoint(self, trainer, state_dict):
        state_dict["global_step"] = trainer.global_step

    def on_load_checkpoint(self, trainer, state_dict):
        if "global_step" in state_dict:
            trainer.global_step = int(state_dict["global_step"])


class ValidationLoop(LoopCallback):
    """``ValidationLoop(eval_steps=None, hook="validate")``: ``eval_steps`` batches (default:
    one pass over the dataloader); ``hook`` renames the loop's hooks to ``on_<hook>_*``."""

    def __init__(self, eval_steps=None, hook="validate"):
        _check_steps("eval_steps", eval_steps)
        if not isinstance(hook, str) or not hook.isidentifier():
            raise ValueError(f"hook must be an identifier, got {hook!r}.")
        self._max_eval_steps = eval_steps
        self._eval_steps = None
        self.hook = hook
        self.on_start_hook = f"on_{hook}_start"
        self.on_end_hook = f"on_{hook}_end"
        self.on_step_start_hook = f"on_{hook}_step_start"
        self.on_step_end_hook = f"on_{hook}_step_end"
        self.on_batch_start_hook = f"on_{hook}_batch_start"
        self.on_batch_end_hook = f"on_{hook}_batch_end"

    @property
    def hooks(self) -> set:
        return {
            self.on_start_hook,
            self.on_end_hook,
            self.on_step_start_hook,
            self.on_step_end_hook,
            self.on_batch_start_hook,
            self.on_batch_end_hook,
        }

    def setup(self, trainer):
        """A validation loop does not own the global step."""

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        """Only the training loop counts steps."""

    def on_save_checkpoint(self, trainer, state_dict):
        """Only the training loop saves the global step."""

    def on_load_checkpoint(self, trainer, state_dict):
        """Only the training loop restores the global step."""

    def on_enter_validate(self, trainer, stack, val_dataloader, loop):
        if loop is not self:
            return
        stack.enter_context(trainer.on_exception("validate"))
        custom = self.hooks - trainer.standard_hooks
        if custom:
            trainer.non_standard_hooks_whitelist |= custom
            stack.callback(trainer.non_standard_hooks_whitelist.difference_update, custom)

    @property
    def eval_steps(self) -> int:
        if self._eval_steps is None:
            raise RuntimeError("eval_steps is known only once the validation loop started.")
        return self._eval_steps

    def compute_eval_steps(self, trainer, val_dataloader) -> int:
        if not trainer.backend.is_e2e_execution:
            self._eval_steps = 1
        else:
            self._eval_steps = cstorch.utils.data.compute_num_steps(
                val_dataloader,
                num_steps=self._max_eval_steps,
                num_epochs=1 if self._max_eval_steps is None else None,
            )
        return self._eval_steps


class TrainingLoop(LoopCallback):
    """``TrainingLoop(num_steps, max_steps, num_epochs, steps_per_epoch, eval_frequency=1.0,
    eval_steps, grad_accum_steps=1)``.

    ``num_steps`` beats ``max_steps`` (which counts from the restored global step);
    ``eval_frequency`` is a step count, a fraction of the run in (0, 1], or None/0 for no
    validation during fit.
    """

    def __init__(
        self,
        num_steps=None,
        max_steps=None,
        num_epochs=None,
        steps_per_epoch=None,
        eval_frequency=1.0,
        eval_steps=None,
        grad_accum_steps=1,
    ):
        for name, value in (
            ("num_steps", num_steps),
            ("max_steps", max_steps),
            ("num_epochs", num_epochs),
            ("steps_per_epoch", steps_per_epoch),
            ("grad_accum_steps", grad_accum_steps),
        ):
            _check_steps(name, value)
        if num_steps is not None and num_epochs is not None:
            raise ValueError(
                "num_steps and num_epochs are mutually exclusive in the loop config; set only one."
            )
        if eval_frequency is not None and (
            isinstance(eval_frequency, bool)
            or not isinstance(eval_frequency, (int, float))
            or eval_frequency < 0
            or (isinstance(eval_frequency, float) and eval_frequency > 1.0)
        ):
            raise ValueError(
                f"eval_frequency must be a positive step count, a fraction in [0.0, 1.0], or "
                f"None, got {eval_frequency!r}."
            )
        self.num_steps = num_steps
        self.max_steps = max_steps
        self.num_epochs = num_epochs
        self.steps_per_epoch = steps_per_epoch
        self.eval_frequency = eval_frequency
        self.grad_accum_steps = grad_accum_steps
        self.val_loop = ValidationLoop(eval_steps)
        self.total_steps = None
        self.train_steps = []  # steps of each training loop of the current fit

    @property
    def eval_steps(self):
        return self.val_loop._max_eval_steps

    @property
    def train_only(self) -> bool:
        return not self.eval_frequency

    @property
    def num_trains(self) -> int:
        return len(self.train_steps)

    def on_enter_fit(self, trainer, stack, train_dataloader, val_dataloader, loop):
        if loop is self:
            stack.enter_context(trainer.on_exception("fit"))

    def on_fit_start(self, trainer, train_dataloader, val_dataloader, loop):
        if loop is not self:
            return
        if not isinstance(train_dataloader, cstorch.utils.data.DataLoader):
            raise TypeError(
                f"train_dataloader must be a cstorch.utils.data.DataLoader, got "
                f"{type(train_dataloader).__name__}."
            )
        if not trainer.backend.is_e2e_execution:
            self.total_steps = 1
        else:
            self.total_steps = cstorch.utils.data.compute_num_steps(
                train_dataloader,
                initial_step=trainer.global_step,
                num_steps=self.num_steps,
                max_steps=self.max_steps,
                num_epochs=self.num_epochs,
                steps_per_epoch=self.steps_per_epoch,
                grad_accum_steps=self.grad_accum_steps,
            )
        self.train_steps = _split(self.total_steps, self.eval_frequency)

    def on_enter_train(self, trainer, stack, train_dataloader, loop, loop_idx):
        if loop is self:
            stack.enter_context(trainer.on_exception("train"))

    def checkpoint_steps(self, every, loop_idx):
        """The executor steps of training loop ``loop_idx`` that save a checkpoint."""
        if not every:
            return None
        offset = sum(self.train_steps[:loop_idx])
        length = self.train_steps[loop_idx]
        is_final = loop_idx == len(self.train_steps) - 1
        start = every - offset % every - 1
        if start < length:
            return Schedule(
                [Schedule.Range(start=start, end=length, step=every, include_last=is_final)]
            )
        if is_final:
            return Schedule(
                [Schedule.Range(start=length - 1, end=length, step=1, include_last=True)]
            )
        return None


def _split(total: int, eval_frequency) -> list:
    """Training-loop lengths for ``total`` steps validated every ``eval_frequency``."""
    if not eval_frequency:
        return [total]
    if isinstance(eval_frequency, float):
        every = max(1, math.floor(total * eval_frequency))
    else:
        every = eval_frequency
    full, rest = divmod(total, every)
    return [every] * full + ([rest] if rest else [])
