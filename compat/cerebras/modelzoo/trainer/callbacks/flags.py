"""Set ``cstorch.backends`` flags for the whole process, for training only, or validation only."""

from __future__ import annotations

import copy

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import Callback


def _owner_and_name(path: str):
    """``"csx.debug.ini"`` -> (``cstorch.backends.csx.debug``, ``"ini"``)."""
    owner = cstorch.backends
    *scopes, name = path.split(".")
    for scope in scopes:
        try:
            owner = getattr(owner, scope)
        except AttributeError:
            raise ValueError(
                f"Unknown flag {path!r}: cstorch.backends has no scope {scope!r}."
            ) from None
    if not hasattr(owner, name):
        raise ValueError(
            f"Unknown flag {path!r}: flags are paths under cstorch.backends, "
            'e.g. "csx.precision.optimization_level".'
        )
    return owner, name


def get_flag(path: str):
    owner, name = _owner_and_name(path)
    return getattr(owner, name)


def set_flag(path: str, value):
    owner, name = _owner_and_name(path)
    setattr(owner, name, value)


class GlobalFlags(Callback):
    """``GlobalFlags(**{"csx.precision.optimization_level": 1})``: set once, at setup, for
    the rest of the process."""

    def __init__(self, **flags):
        self.flags = copy.deepcopy(flags)

    def pre_setup(self, trainer):
        for path, value in self.flags.items():
            set_flag(path, value)


class _ScopedFlags(Callback):
    def __init__(self, **flags):
        self.flags = copy.deepcopy(flags)
        self._saved = {}

    def _apply(self):
        if self._saved:
            return
        for path, value in self.flags.items():
            self._saved[path] = get_flag(path)
            set_flag(path, value)

    def _restore(self):
        for path, value in self._saved.items():
            set_flag(path, value)
        self._saved.clear()


class ScopedTrainFlags(_ScopedFlags):
    """Flags set for each training loop and restored after it."""

    def on_train_start(self, trainer, model, train_dataloader, loop, loop_idx):
        self._apply()

    def on_train_end(self, trainer, model, loop, loop_idx):
        self._restore()

    def on_train_exception(self, trainer, exception):
        self._restore()


class ScopedValidateFlags(_ScopedFlags):
    """Flags set for each validation loop and restored after it."""

    def on_validate_start(self, trainer, model, val_dataloader, loop):
        self._apply()

    def on_validate_end(self, trainer, model, loop):
        self._restore()

    def on_validate_exception(self, trainer, exception):
        self._restore()
