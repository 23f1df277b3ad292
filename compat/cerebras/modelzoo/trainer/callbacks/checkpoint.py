"""Checkpoints: when they are saved, where, which one is loaded, and what they restore."""

from __future__ import annotations

import os
import re
import string
import time
import warnings
from pathlib import Path

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import Callback, CoreCallback
from cstorch.errors import quoted
from cstorch.utils.checkpoint_files import find_checkpoints

_SAMPLE_STEPS = (0, 7, 12, 1000, 123456789)


def checkpoint_name_parts(checkpoint_name) -> tuple:
    """``(before, spec, after)`` of a checkpoint name: the text around its one ``{step}``
    field (``{step:06d}`` too) and that field's format. Raises ValueError unless every step
    gives a file name (no directory) whose step reads back from it, which is what finding
    the latest checkpoint needs: ``{step:6d}`` (spaces), ``{step:x}``, a second field or a
    ``/`` are refused here, before anything is built or saved."""
    rule = (
        "checkpoint_name must be a file name with the field {step} exactly once, written "
        "as digits (checkpoint_{step}.mdl, ckpt_{step:06d}.mdl), and no other field"
    )
    if not isinstance(checkpoint_name, str):
        raise ValueError(f"{rule}; got {type(checkpoint_name).__name__} {quoted(checkpoint_name)}.")
    try:
        parsed = list(string.Formatter().parse(checkpoint_name))
    except ValueError as error:  # unbalanced braces
        raise ValueError(f"{rule}; got {quoted(checkpoint_name)} ({error}).") from None
    fields = [
        (field, conversion, spec) for _, field, spec, conversion in parsed if field is not None
    ]
    if [field for field, _, _ in fields] != ["step"] or fields[0][1] is not None:
        raise ValueError(f"{rule}; got {quoted(checkpoint_name)}.")
    index = next(i for i, (_, field, _, _) in enumerate(parsed) if field is not None)
    before = "".join(literal for literal, *_ in parsed[: index + 1])
    after = "".join(literal for literal, *_ in parsed[index + 1 :])
    spec = fields[0][2] or ""
    for step in _SAMPLE_STEPS:
        try:
            name = checkpoint_name.format(step=step)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{rule}; got {quoted(checkpoint_name)} ({error}).") from None
        middle = name[len(before) : len(name) - len(after)]
        if (
            os.sep in name
            or (os.altsep and os.altsep in name)
            or name in (".", "..")
            or not middle.isdigit()
            or int(middle) != step
        ):
            raise ValueError(
                f"{rule}; got {quoted(checkpoint_name)}, which names step {step} {name!r}."
            )
    return before, spec, after


class Checkpoint(CoreCallback):
    """``Checkpoint(steps=None, autoload_last_checkpoint=True,
    disable_strict_checkpoint_loading=False, save_initial_checkpoint=False,
    checkpoint_root=None, checkpoint_name="checkpoint_{step}.mdl", strict_version=True)``.

    Saves every ``steps`` global steps of a fit and at its last step (``steps=None``/0: never),
    as ``cstorch.save`` files under ``checkpoint_root`` (default: the model directory).
    Checkpoints record the cstorch version; loading one of another major.minor version raises
    (warns with ``strict_version=False``).
    """

    def __init__(
        self,
        steps=None,
        autoload_last_checkpoint=True,
        disable_strict_checkpoint_loading=False,
        save_initial_checkpoint=False,
        checkpoint_root=None,
        checkpoint_name="checkpoint_{step}.mdl",
        strict_version=True,
    ):
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, int) or steps < 0
        ):
            raise ValueError(
                f"Checkpoint steps must be None or a non-negative integer, got {steps!r}."
            )
        checkpoint_name_parts(checkpoint_name)
        self.steps = steps
        self.autoload_last_checkpoint = autoload_last_checkpoint
        self.disable_strict_checkpoint_loading = disable_strict_checkpoint_loading
        self.save_initial_checkpoint = save_initial_checkpoint
        self.checkpoint_root = None if checkpoint_root is None else Path(checkpoint_root)
        self.checkpoint_name = checkpoint_name
        self.strict_version = strict_version
        self._initial_saved = False

    def setup(self, trainer):
        if self.checkpoint_root is None:
            self.checkpoint_root = trainer.model_dir
        self.checkpoint_root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------------------- saving
    def on_train_start(self, trainer, model, train_dataloader, loop, loop_idx):
        if self.save_initial_checkpoint and loop_idx == 0 and not self._initial_saved:
            self._initial_saved = True
            trainer.save_checkpoint()  # a checkpoint closure: runs before the first step

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        trainer.save_checkpoint()  # a checkpoint closure: runs on checkpoint steps only

    def on_save_checkpoint(self, trainer, state_dict):
        state_dict["__metadata__"] = [{"version": cstorch.__version__}]

    def on_after_save_checkpoint(self, trainer, ckpt_path):
        trainer.logger.info(f"Saved checkpoint {ckpt_path}")

    def preprocess_checkpoint(self, trainer, state_dict):
        metadata = state_dict.get("__metadata__")
        version = (
            metadata[-1].get("version", "")
            if isinstance(metadata, list) and metadata and isinstance(metadata[-1], dict)
            else ""
        )
        if not version:
            return
        ours = cstorch.__version__.split(".")[:2]
        if str(version).split("+")[0].split(".")[:2] == ours:
            return
        message = (
            f"The checkpoint was written by version {version}, which is incompatible "
            f"with this version ({cstorch.__version__}): convert it first."
        )
        if self.strict_version:
            raise ValueError(
                message + " If you are sure it is compatible, set Checkpoint(strict_version=False)."
            )
        warnings.warn(message, stacklevel=2)

    def get_checkpoint_path(self, step: int) -> Path:
        path = self.checkpoint_root / self.checkpoint_name.format(step=step)
        if path.exists():  # never overwrite: keep both, the newer one timestamped
            path = path.with_name(f"{path.stem}_{time.strftime('%Y%m%d_%H%M%S')}{path.suffix}")
        return path

    # ------------------------------------------------------------------------------ loading
    @property
    def checkpoint_regex(self) -> re.Pattern:
        before, _, after = checkpoint_name_parts(self.checkpoint_name)
        stem, ext = after.rsplit(".", 1) if "." in after else (after, None)
        ext = "" if ext is None else "." + ext
        return re.compile(
            re.escape(before)
            + r"(?P<step>\d+)"
            + re.escape(stem)
            + r"(?:_(?P<stamp>\d{8}_\d{6}))?"
            + re.escape(ext)
            + "$"
        )

    def get_all_checkpoints(self, root=None) -> list:
        """Checkpoints under ``root`` that match the name pattern, oldest step first."""
        return find_checkpoints(root or self.checkpoint_root, self.checkpoint_regex)

    def get_latest_checkpoint(self, trainer):
        checkpoints = self.get_all_checkpoints()
        if not checkpoints:
            trainer.logger.info(
                f"No checkpoint found under {self.checkpoint_root}; starting "
                "from the initial state."
            )
            return None
        trainer.logger.info(f"Found latest checkpoint {checkpoints[-1]}.")
        return checkpoints[-1]


class KeepNCheckpoints(Callback):
    """Keeps only the newest ``n`` checkpoints this trainer's name pattern matches."""

    def __init__(self, n=None):
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"KeepNCheckpoints(n) needs a positive integer or None, got {n!r}.")
        self.n = n

    def on_after_save_checkpoint(self, trainer, ckpt_path):
        if self.n is None:
            return
        for old in trainer.checkpoint.get_all_checkpoints()[: -self.n]:
            old.unlink()


class LoadCheckpointStates(Callback):
    """Restores only some of a checkpoint's states: ``"all"``, a list of keys (``model``,
    ``optimizer``, ``schedulers``, ``global_step``, ...) or a comma-separated string."""

    def __init__(self, load_checkpoint_states="all"):
        if isinstance(load_checkpoint_states, str):
            states = load_checkpoint_states.split(",")
        elif isinstance(load_checkpoint_states, (list, tuple, set)):
            states = list(load_checkpoint_states)
        else:
            raise TypeError(
                f"load_checkpoint_states must be 'all', a list or a comma-separated "
                f"string, got {type(load_checkpoint_states).__name__}."
            )
        self.states = {s.strip() for s in states if s.strip()}
        if not self.states:
            raise ValueError("load_checkpoint_states names no state.")

    def preprocess_checkpoint(self, trainer, state_dict):
        if "all" in self.states:
            return
        missing = self.states - set(state_dict)
        if missing:
            warnings.warn(
                f"States {sorted(missing)} requested by LoadCheckpointStates are not "
                f"in the checkpoint (it has {sorted(state_dict)}).",
                stacklevel=2,
            )
        for key in list(state_dict):
            if key not in self.states and key != "__metadata__":
                del state_dict[key]
