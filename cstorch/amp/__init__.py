"""Mixed precision: the half-dtype policy, autocast, loss scaling."""

from cstorch.backend.precision import (
    enable_mixed_precision,
    get_floating_point_dtype,
    get_floating_point_dtype_str,
    get_half_dtype,
    get_half_dtype_str,
    is_cbfloat16_tensor,
    mixed_precision,
    set_half_dtype,
    use_bfloat16,
)
from cstorch.amp._compat import (
    disable_casts,
    finite_increment,
    float_function,
    half_function,
    init,
    isfinite,
    promote_function,
    register_float_function,
    register_half_function,
    register_promote_function,
    update_if_finite,
)
from cstorch.amp.autocast import autocast
from cstorch.amp.grad_scaler import GradScaler, setup_optimizer
from cstorch.amp.optimizer_step import optimizer_step

__all__ = ["GradScaler", "optimizer_step"]

