"""``cstorch.amp.autocast``: run a region in the half dtype (torch autocast semantics)."""

from __future__ import annotations

import contextlib

import torch

from cstorch.backend import current_backend_impl, precision
from jax_backend.errors import CstorchValueError


@contextlib.contextmanager
def autocast(dtype: torch.dtype = None):
    """Autocast to ``dtype`` (default: the half dtype). A no-op on CSX, which always runs
    mixed precision. On CPU only bfloat16 is accepted, as in cerebras-pytorch."""
    impl = current_backend_impl()
    if impl.is_csx:
        yield None
        return
    dtype = dtype or precision.get_half_dtype()
    if impl.backend_type.is_cpu and dtype != torch.bfloat16:
        raise CstorchValueError(
            f"autocast on the CPU backend supports torch.bfloat16 only, got {dtype}. Use "
            'cstorch.amp.autocast(torch.bfloat16), or cstorch.amp.set_half_dtype("float16") '
            "to train the whole step in float16."
        )
    with torch.autocast("cpu", dtype=dtype) as context:
        yield context
