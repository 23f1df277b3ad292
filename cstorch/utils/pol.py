"""``pol`` and ``current_pol``: precision optimization level (POL) annotations."""

from __future__ import annotations

from typing import Optional

from cstorch.core.annotation import annotation, current_annotation
from jax_backend.errors import CstorchValueError


def pol(
    level: Optional[int] = None,
    bwd_level: Optional[int] = None,
    enable_fwd: bool = True,
    enable_bwd: bool = True,
):
    """A decorator that runs the function at POL ``level`` (backward at ``bwd_level``).

    Levels must be None, 0, 1 or 2 (ValueError when the decorator is built).
    """
    for name, value in (("forward", level), ("backward", bwd_level)):
        if value is not None and value not in (0, 1, 2):
            raise CstorchValueError(
                f"POL must be None or an integer in range [0, 3) but got {name} level {value!r}."
            )
    return annotation("pol", level, enable_fwd=enable_fwd, enable_bwd=enable_bwd)


def current_pol() -> int:
    """The POL in effect: the innermost ``@pol`` level, else
    ``backends.csx.precision.optimization_level``."""
    from cstorch.backends import backends

    level = current_annotation("pol")
    return backends.csx.precision.optimization_level if level is None else level
