"""Finding a run's checkpoint files by name: the one lookup the compatibility runners use.

A name pattern is a compiled regular expression matched against whole file names, with a
group ``step`` (digits) and optionally a group ``stamp`` (a sortable timestamp that tells
apart several files of one step). The newest checkpoint is the one with the highest step,
then the latest stamp.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def find_checkpoints(directory, pattern: re.Pattern) -> list[Path]:
    """The files in ``directory`` whose whole name matches ``pattern``, oldest first; an empty
    list when the directory does not exist."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in os.scandir(directory):
        match = pattern.fullmatch(entry.name)
        if match:
            stamp = match.groupdict().get("stamp") or ""
            found.append((int(match["step"]), stamp, entry.name))
    return [directory / name for _, _, name in sorted(found)]
