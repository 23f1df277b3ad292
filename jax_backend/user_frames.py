"""Which stack frames are the user's: errors name them and warnings point at them.

A frame is internal when its file lies in torch, JAX, this package, ``contextlib`` or a
directory registered with ``register_internal_dir`` (cstorch registers itself). The user's
frame is the innermost frame that is not internal: the line in the user's step or script
that led to the error or warning, however deep inside the libraries it was raised (a lowering
runs inside JAX's tracing, itself inside the engine).

Every warning of the project that is about the user's code goes through ``warn`` here rather
than ``warnings.warn(..., stacklevel=N)``: a literal frame count breaks as soon as a call path
through the library changes (``tests/test_code_rules.py`` refuses one above 2).
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import types
import warnings

import jax
import torch

TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_INTERNAL_DIRS = [
    TORCH_DIR,
    PACKAGE_DIR,
    os.path.dirname(contextlib.__file__) + os.sep,
    os.path.dirname(jax.__file__) + os.sep,
]


def register_internal_dir(path: str) -> None:
    """Marks a library directory whose frames are never "the user's line"."""
    path = os.path.abspath(path) + os.sep
    if path not in _INTERNAL_DIRS:
        _INTERNAL_DIRS.append(path)


def is_internal(filename: str) -> bool:
    filename = os.path.abspath(filename)
    return any(filename.startswith(d) for d in _INTERNAL_DIRS)


def format_user_frame(frames) -> str | None:
    """The innermost user frame of ``frames`` (``traceback.FrameSummary``s), formatted as a
    traceback line, or None if all of them are internal."""
    for frame in reversed(frames):
        if not is_internal(frame.filename):
            return (
                f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}\n    {frame.line}'
            )
    return None


def user_frame(tb) -> str | None:
    """The user's frame in a traceback."""
    return format_user_frame(traceback.extract_tb(tb))


def current_user_frame() -> str | None:
    """The user's frame in the current call stack."""
    return format_user_frame(traceback.extract_stack())


def warn(message: str, category: type = UserWarning) -> None:
    """``warnings.warn`` attributed to the innermost user frame of the current stack, so the
    warning shows the user's line (and ``-W error``/filters by module match the user's code)
    however many library frames lie between."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and is_internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    if frame is None:  # called from library code only (e.g. an import): the direct caller
        level = 1
    warnings.warn(message, category, stacklevel=level + 1)
