"""``kernel_annotater``: ask the (modeled) compiler for a named kernel for a function's ops."""

from __future__ import annotations

import dataclasses
from typing import Optional

from cstorch.backend import use_cs
from cstorch.core.annotation import AnnotationMode, create_annotation
from jax_backend.errors import CstorchTypeError


@dataclasses.dataclass
class KernelConfig(AnnotationMode.Config):
    kernel: Optional[str] = None
    enable_fwd: bool = True
    enable_bwd: bool = True

    def __post_init__(self):
        if not isinstance(self.kernel, (str, type(None))):
            raise CstorchTypeError(
                f"kernel must be a str or None, got {type(self.kernel).__name__}."
            )


def get_attribute(config: KernelConfig, is_backward: bool) -> AnnotationMode.Attribute:
    return AnnotationMode.Attribute("kernel", config.kernel)


def kernel_annotater(kernel: Optional[str] = None):
    """A decorator tagging the function's ops with ``kernel`` on CSX; the identity elsewhere."""
    if not use_cs():
        return lambda fn: fn
    return create_annotation(KernelConfig, get_attribute, kernel=kernel)
