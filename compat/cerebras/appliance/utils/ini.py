"""Compiler INI settings inside debug args (``debug_args["ini"]``)."""

from __future__ import annotations

from cstorch.backends import DebugArgs

_SUPPORTED = (bool, int, float, str)


def _check(kwargs: dict) -> dict:
    for name, value in kwargs.items():
        if not isinstance(value, _SUPPORTED):
            raise TypeError(
                f"INI {name!r} must be a bool, int, float or str, got {type(value).__name__}."
            )
    return kwargs


def set_ini(debug_args: DebugArgs, **kwargs) -> None:
    """Sets the given INIs, replacing values already there."""
    debug_args.setdefault("ini", {}).update(_check(kwargs))


def set_default_ini(debug_args: DebugArgs, **kwargs) -> None:
    """Sets the given INIs that are not set yet."""
    ini = debug_args.setdefault("ini", {})
    for name, value in _check(kwargs).items():
        ini.setdefault(name, value)


def clear_ini(debug_args: DebugArgs, *args, **kwargs) -> None:
    """Removes the named INIs."""
    ini = debug_args.get("ini", {})
    for name in (*args, *kwargs):
        ini.pop(name, None)
