"""dtype helpers of the storage layer, and ``to_deferred``."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils._pytree import tree_map

from cstorch.storage import conversions


def torch_to_np_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a tensor of ``dtype`` is stored as (bfloat16: ml_dtypes.bfloat16)."""
    if dtype == torch.bfloat16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return torch.empty(0, dtype=dtype).numpy().dtype


def np_to_torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (ml_dtypes.bfloat16 included)."""
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def to_deferred(tensors):
    """Replaces each tensor whose newest value lives on the device (state of a compiled step)
    by a lazy tensor over that value, so saving it writes straight from the device array
    without first copying it into the torch object. Other values are returned unchanged."""
    from cstorch.backend import current_backend_impl

    impl = current_backend_impl(raise_exception=False)
    if impl is None:
        return tensors
    lazy = conversions.lazy_tensor_class()

    def defer(value):
        if isinstance(value, torch.Tensor) and impl.device_state.is_stale(value):
            return lazy(impl.device_state.snapshot(value))
        return value

    return tree_map(defer, tensors)
