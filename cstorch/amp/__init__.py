"""Mixed precision: the half-dtype policy."""

from cstorch.amp import _amp_state
from cstorch.amp._amp_state import (
    enable_mixed_precision,
    get_floating_point_dtype,
    get_floating_point_dtype_str,
    get_half_dtype,
    get_half_dtype_str,
    is_cbfloat16_tensor,
    mixed_precision,
    set_half_dtype,
)

__all__ = [
    "_amp_state", "enable_mixed_precision", "get_floating_point_dtype",
    "get_floating_point_dtype_str", "get_half_dtype", "get_half_dtype_str",
    "is_cbfloat16_tensor", "mixed_precision", "set_half_dtype",
]
