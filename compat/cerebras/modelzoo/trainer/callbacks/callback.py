"""The callback protocol of the Trainer: every hook it dispatches, as a documented no-op.

A Trainer owns no behaviour of its own beyond the order of events; everything it does
(building the backend and model, counting steps, checkpointing, logging) is a callback. Hooks
come in two kinds, and the docstrings below say which each one is:

* **eager** hooks run in Python once per occurrence (per batch, per loop, per fit), and
  tensors they receive from a step are that step's outputs (read them in a step closure);
* **trace-time** hooks run inside a ``@cstorch.trace`` step, i.e. once, while the step is
  captured. What they add to the graph runs on every step; Python side effects do not.

Callbacks used as context managers (``with MyCallback():``) are registered globally for the
block and see the hooks of every Trainer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict

# Callbacks every Trainer calls after its own (``with callback:`` or register_global_callback).
GLOBAL_CALLBACK_REGISTRY: "OrderedDict[int, Callback]" = OrderedDict()


class _GlobalHandle:
    """Removes a globally registered callback again."""

    def __init__(self, key):
        self.key = key

    def remove(self):
        GLOBAL_CALLBACK_REGISTRY.pop(self.key, None)


def register_global_callback(callback: "Callback") -> _GlobalHandle:
    """Makes every Trainer call ``callback``'s hooks (after its own callbacks)."""
    if not isinstance(callback, Callback):
        raise TypeError(f"Expected a Callback, got {type(callback).__name__}.")
    key = id(callback)
    GLOBAL_CALLBACK_REGISTRY[key] = callback
    return _GlobalHandle(key)


class Callback:
    """Base class of everything the Trainer calls. Every hook is a no-op here.

    ``trainer`` is always the first argument (except ``finalize``).
    """

    # ----------------------------------------------------------------------- context manager
    def __enter__(self):
        self._global_handle = register_global_callback(self)
        return self

    def __exit__(self, *exc):
        self._global_handle.remove()
        return False

    # ---------------------------------------------------------------------------- lifecycle
    def pre_setup(self, trainer):
        """Eager, once, first thing in the constructor; core callbacks create the backend here."""

    def setup(self, trainer):
        """Eager, once: backend, model, optimizer and schedulers exist after the core callbacks
        have run theirs (in core-callback order)."""

    def post_setup(self, trainer):
        """Eager, once, at the end of the constructor; everything is set up."""

    def finalize(self):
        """Eager, once, when the Trainer is garbage collected (no trainer argument)."""

    # ---------------------------------------------------------------------------------- fit
    def on_enter_fit(self, trainer, stack, train_dataloader, val_dataloader, loop):
        """Eager, once per fit, before anything else; ``stack`` is an ExitStack closed when
        fit returns (enter context managers on it)."""

    def on_fit_start(self, trainer, train_dataloader, val_dataloader, loop):
        """Eager, once per fit, after the checkpoint (if any) was loaded."""

    def on_fit_end(self, trainer, loop):
        """Eager, once per fit, after the last train and validation loop."""

    def on_fit_exception(self, trainer, exception):
        """Eager: fit raised ``exception`` (re-raised after the hook)."""

    # -------------------------------------------------------------------------------- train
    def on_enter_train(self, trainer, stack, train_dataloader, loop, loop_idx):
        """Eager, once per training loop (a fit has one per eval interval)."""

    def on_train_start(self, trainer, model, train_dataloader, loop, loop_idx):
        """Eager, once per training loop, before its data executor is built."""

    def on_train_end(self, trainer, model, loop, loop_idx):
        """Eager, once per training loop, after its last step and step closures."""

    def on_train_exception(self, trainer, exception):
        """Eager: a training loop raised ``exception`` (re-raised after the hook)."""

    def on_train_batch_start(self, trainer, model, batch, batch_idx):
        """Eager, every step, before the compiled step runs on ``batch``."""

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        """Eager, every step, right after the compiled step was dispatched: ``outputs`` are
        this step's (lazy) outputs; pass them to a step closure to read their values."""

    def on_train_step_start(self, trainer, model, batch):
        """Trace-time: first thing inside the traced training step."""

    def on_train_step_end(self, trainer, model, outputs, batch):
        """Trace-time: last thing inside the traced training step."""

    # --------------------------------------------------------------------------- validation
    def run_validation(self, trainer, loop_idx, is_last):
        """Eager: downstream validation after the upstream validation of a fit interval (or of
        validate_all); ``is_last`` on the final one."""

    def on_enter_validate(self, trainer, stack, val_dataloader, loop):
        """Eager, once per validation loop, before anything else of it."""

    def on_validate_start(self, trainer, model, val_dataloader, loop):
        """Eager, once per validation loop (the model is in eval mode after the core
        callbacks)."""

    def on_validate_end(self, trainer, model, loop):
        """Eager, once per validation loop, after its last step and step closures."""

    def on_validate_exception(self, trainer, exception):
        """Eager: a validation loop raised ``exception`` (re-raised after the hook)."""

    def on_validate_batch_start(self, trainer, model, batch, batch_idx):
        """Eager, every validation step, before the compiled step runs."""

    def on_validate_batch_end(self, trainer, model, outputs, batch, batch_idx):
        """Eager, every validation step, with this step's (lazy) outputs."""

    def on_validate_step_start(self, trainer, model, batch):
        """Trace-time: first thing inside the traced validation step."""

    def on_validate_step_end(self, trainer, model, outputs, batch):
        """Trace-time: last thing inside the traced validation step."""

    def on_enter_validate_all(self, trainer, stack, val_dataloaders, loop, ckpt_paths):
        """Eager, once per validate_all (also the validation of each fit interval)."""

    # ------------------------------------------------------------------------ step internals
    def on_before_forward(self, trainer, model, batch, args, kwargs):
        """Trace-time: before the model call; append to ``args``/``kwargs`` to pass more."""

    def on_after_forward(self, trainer, model, outputs, batch):
        """Trace-time: ``outputs`` is the model's output as a dict (a bare tensor is
        ``{"loss": tensor}``)."""

    def on_before_backward(self, trainer, model, outputs):
        """Trace-time, training only: before ``outputs["loss"]`` is backpropagated."""

    def on_after_backward(self, trainer, model, outputs):
        """Trace-time, training only: gradients exist."""

    def on_before_optimizer_step(self, trainer, model, optimizer):
        """Trace-time: before clipping and the optimizer step."""

    def on_after_optimizer_step(self, trainer, model, optimizer):
        """Trace-time: after the optimizer step."""

    def on_before_optimizer_zero_grad(self, trainer, model, optimizer):
        """Trace-time: before gradients are cleared."""

    def on_after_optimizer_zero_grad(self, trainer, model, optimizer):
        """Trace-time: after gradients are cleared."""

    def on_before_scheduler_step(self, trainer, model, optimizer, scheduler):
        """Trace-time: before each scheduler steps."""

    def on_after_scheduler_step(self, trainer, model, optimizer, scheduler):
        """Trace-time: after each scheduler stepped."""

    # --------------------------------------------------------------------------- checkpoint
    def on_save_checkpoint(self, trainer, state_dict):
        """Eager, in the checkpoint closure of a checkpoint step: add this callback's state to
        ``state_dict`` (state tensors hold the values of the step)."""

    def postprocess_checkpoint(self, trainer, state_dict):
        """Eager: last edit of ``state_dict`` before it is written."""

    def on_after_save_checkpoint(self, trainer, ckpt_path):
        """Eager: the checkpoint file ``ckpt_path`` was written."""

    def on_before_load_checkpoint(self, trainer, ckpt_path):
        """Eager: a checkpoint is about to be loaded (``ckpt_path`` None: none will be)."""

    def preprocess_checkpoint(self, trainer, state_dict):
        """Eager: first edit of a loaded ``state_dict`` (e.g. drop keys)."""

    def on_load_checkpoint(self, trainer, state_dict):
        """Eager: restore this callback's state from ``state_dict``."""


class CoreCallback(Callback):
    """Marks the Trainer's own callbacks; users cannot pass or replace them as callbacks."""


class ValidationCallback(Callback, ABC):
    """A downstream validation (e.g. an eval harness) run by fit and validate_all."""

    @property
    @abstractmethod
    def name_scope(self) -> str:
        """The metric prefix of this validation."""

    @property
    @abstractmethod
    def every_n_vals(self) -> int:
        """Run on every n-th validation of a fit."""

    @property
    @abstractmethod
    def num_validate_loops(self) -> int:
        """How many validation loops one run_validation performs."""

    @abstractmethod
    def run_validation(self, trainer, loop_idx, is_last):
        """Runs the downstream validation."""
