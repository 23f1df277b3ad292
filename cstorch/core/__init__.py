"""Core pieces: compile/trace and devices."""

from cstorch.core import compile, device

__all__ = ["compile", "device"]
