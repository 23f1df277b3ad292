"""Core pieces: compile/trace and devices."""

from cstorch.core import compile, device  # noqa: A004

__all__ = ["compile", "device"]
