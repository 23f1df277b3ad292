"""``device_annotation``: places the decorated function on the weight host, the activation
host or the wafer."""

from __future__ import annotations

from cstorch.core.annotation import annotation
from jax_backend.errors import CstorchTypeError

DEVICE_TYPES = ("wgth", "acth", "wafer")


def device_annotation(device, enable_fwd=True, enable_bwd=True):
    """A decorator annotating the function's operations with ``device`` ("wgth", "acth" or
    "wafer"; anything else → TypeError)."""
    if device not in DEVICE_TYPES:
        raise CstorchTypeError(f"Expected `device` to be one of {DEVICE_TYPES}, got {device!r}.")
    return annotation("device_annotation", device, enable_fwd=enable_fwd, enable_bwd=enable_bwd)
