"""Argument checks shared by the built-in optimizers (ValueError quoting the bad value)."""

from __future__ import annotations

from jax_backend.errors import CstorchTypeError, CstorchValueError


def _number(name: str, value) -> None:
    """A Python or numpy number, or a tensor (a scheduled value); a string (``lr="fast"`` from
    a config file) is named here instead of failing in a comparison."""
    if isinstance(value, (str, bytes)) or value is None:
        raise CstorchTypeError(f"Invalid {name}: {value!r} - should be a number")


def non_negative(name: str, value) -> None:
    """``value >= 0``."""
    _number(name, value)
    if value < 0.0:
        raise CstorchValueError(f"Invalid {name}: {value!r} - should be >= 0.0")


def in_unit_interval(name: str, value, *, include_one: bool = False) -> None:
    """``0 <= value < 1`` (``<= 1`` with ``include_one``)."""
    _number(name, value)
    ok = 0.0 <= value <= 1.0 if include_one else 0.0 <= value < 1.0
    if not ok:
        bounds = "[0.0, 1.0]" if include_one else "[0.0, 1.0)"
        raise CstorchValueError(f"Invalid {name}: {value!r} - should be in {bounds}")


def betas(values) -> None:
    """Both betas in ``[0, 1)``."""
    for index in range(2):
        in_unit_interval(f"beta parameter at index {index}", values[index])
