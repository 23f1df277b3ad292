"""Mixed precision: the half-dtype policy, autocast, loss scaling."""

from cstorch.amp._compat import (
    disable_casts as disable_casts,
    finite_increment as finite_increment,
    float_function as float_function,
    half_function as half_function,
    init as init,
    isfinite as isfinite,
    promote_function as promote_function,
    register_float_function as register_float_function,
    register_half_function as register_half_function,
    register_promote_function as register_promote_function,
    update_if_finite as update_if_finite,
)
from cstorch.amp.autocast import autocast as autocast
from cstorch.amp.grad_scaler import GradScaler, setup_optimizer as setup_optimizer
from cstorch.amp.optimizer_step import optimizer_step
from cstorch.backend.precision import (
    enable_mixed_precision as enable_mixed_precision,
    get_floating_point_dtype as get_floating_point_dtype,
    get_floating_point_dtype_str as get_floating_point_dtype_str,
    get_half_dtype as get_half_dtype,
    get_half_dtype_str as get_half_dtype_str,
    is_cbfloat16_tensor as is_cbfloat16_tensor,
    mixed_precision as mixed_precision,
    set_half_dtype as set_half_dtype,
    use_bfloat16 as use_bfloat16,
)

__all__ = ["GradScaler", "optimizer_step"]
