"""Where a Trainer writes: ``<model_dir>/cerebras_logs/<timestamp>`` (artifacts) and
``<model_dir>/<timestamp>`` (summaries)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback


def _fresh_timestamp(model_dir: Path) -> str:
    """A ``YYYYmmdd_HHMMSS`` name not used yet under ``model_dir`` (two Trainers built in the
    same second get ``_2``, ``_3`` suffixes)."""
    stamp = time.strftime("%Y%m%d_%H%M%S")
    name, n = stamp, 1
    while (model_dir / "cerebras_logs" / name).exists() or (model_dir / name).exists():
        n += 1
        name = f"{stamp}_{n}"
    return name


class ArtifactDirCallback(CoreCallback):
    """Creates the trainer's artifact and summary directories (and a ``latest`` link)."""

    def pre_setup(self, trainer):
        trainer.model_dir.mkdir(parents=True, exist_ok=True)
        stamp = _fresh_timestamp(trainer.model_dir)
        logs = trainer.model_dir / "cerebras_logs"
        trainer.artifact_dir = logs / stamp
        trainer.artifact_dir.mkdir(parents=True)
        latest = logs / "latest"
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        try:
            os.symlink(stamp, latest)
        except OSError:  # filesystems without symlinks: the timestamped directory suffices
            pass
        trainer.summary_dir = trainer.model_dir / stamp
        trainer.summary_dir.mkdir(parents=True, exist_ok=True)
