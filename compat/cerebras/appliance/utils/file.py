"""File helpers: symlinks that survive parallel runs, path sizes."""

from __future__ import annotations

import os
import time
from pathlib import Path


def is_pathlike(name) -> bool:
    return isinstance(name, (str, os.PathLike))


def get_path_size(path) -> int:
    """Bytes under ``path`` (a file, or a directory walked recursively)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    raise ValueError(f"Path {str(path)!r} is not a file or directory.")


def create_symlink(src: Path, dst: Path, num_retries: int = 5, **kwargs) -> None:
    """Makes ``src`` a symlink to ``dst``, replacing what ``src`` was; retried a few times
    because runs sharing a directory may race on it."""
    src = Path(src)
    for _ in range(num_retries - 1):
        try:
            src.unlink(missing_ok=True)
            src.symlink_to(dst, **kwargs)
            return
        except OSError:
            time.sleep(0.5)
    src.unlink(missing_ok=True)
    src.symlink_to(dst, **kwargs)
