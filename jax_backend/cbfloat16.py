"""cbfloat16, Cerebras' 16-bit float, emulated in float32.

cbfloat16 has 1 sign bit, a 6-bit exponent (bias 31) and a 9-bit mantissa: three more
exponent bits than float16 (range up to ~4.3e9 instead of 65504) for one fewer mantissa bit.
No JAX or torch dtype has that layout, so a cbfloat16 value is a float32 holding a number of
the cbfloat16 grid: ``round_to_cbfloat16`` rounds to nearest (ties to even) at 9 mantissa
bits, underflows gradually to cbfloat16's subnormals (multiples of 2**-39) and overflows to
±inf past the largest finite value, as an IEEE-style format does. Overflow becoming inf (not
saturating) is what lets dynamic loss scaling see it and skip the step.

The step is traced with torch's float16 standing in for cbfloat16 (as the reference does:
``torch.float16`` is cbfloat16's "proxy dtype"). ``Float16AsCbfloat16`` is the interpreter's
view of that graph: every float16 value is held as float32 on the cbfloat16 grid (float16
dtype arguments become float32, every float16 result is rounded), and the step's float16
inputs and outputs are converted at its edges.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

EXPONENT_BITS = 6
MANTISSA_BITS = 9
EXPONENT_BIAS = 2 ** (EXPONENT_BITS - 1) - 1  # 31
MIN_NORMAL_EXPONENT = 1 - EXPONENT_BIAS  # -30
MAX_EXPONENT = 2**EXPONENT_BITS - 2 - EXPONENT_BIAS  # 31: the all-ones exponent is inf/NaN
MAX = (2.0 - 2.0**-MANTISSA_BITS) * 2.0**MAX_EXPONENT  # 4290772992.0 (2**32 - 2**22)
SUBNORMAL_STEP = 2.0 ** (MIN_NORMAL_EXPONENT - MANTISSA_BITS)  # 2**-39

_DROPPED = 23 - MANTISSA_BITS  # float32 mantissa bits cbfloat16 has no room for
_MAX_BITS = int(np.array(MAX, np.float32).view(np.uint32))


def round_to_cbfloat16(x):
    """``x`` (float32) rounded to the nearest cbfloat16 value, as float32."""
    x = jnp.asarray(x, jnp.float32)
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    sign = bits & jnp.uint32(0x80000000)
    magnitude = bits & jnp.uint32(0x7FFFFFFF)
    # Normal range: round the float32 mantissa to 9 bits, ties to even (a carry into the
    # exponent is the correct result); anything rounding past MAX is infinite.
    lsb = (magnitude >> _DROPPED) & jnp.uint32(1)
    rounded = (magnitude + jnp.uint32((1 << (_DROPPED - 1)) - 1) + lsb) & jnp.uint32(
        ~((1 << _DROPPED) - 1) & 0xFFFFFFFF
    )
    rounded = jnp.where(rounded > jnp.uint32(_MAX_BITS), jnp.uint32(0x7F800000), rounded)
    normal = lax.bitcast_convert_type(sign | rounded, jnp.float32)
    # Below the smallest normal the grid is evenly spaced: scaling by a power of two is exact.
    # Only the small values are scaled: XLA folds ``(b * c1) * 2**39`` into ``b * (c1 * 2**39)``,
    # and where the user's ``c1`` is huge (a mask's ``finfo.min``) that constant is inf, so a
    # zero ``b`` would give NaN, which the select below then picks (zero is "small").
    small = jnp.abs(x) < np.float32(2.0**MIN_NORMAL_EXPONENT)
    tiny = jnp.where(small, x, np.float32(0))
    subnormal = jnp.round(tiny * np.float32(1 / SUBNORMAL_STEP)) * np.float32(SUBNORMAL_STEP)
    out = jnp.where(small, subnormal, normal)
    return jnp.where(jnp.isfinite(x), out, x)  # inf and NaN stay as they are


def _float16_to_float32(value):
    if isinstance(value, torch.dtype):
        return torch.float32 if value == torch.float16 else value
    if isinstance(value, (list, tuple)):
        mapped = [_float16_to_float32(v) for v in value]
        return type(value)(mapped) if isinstance(value, tuple) else mapped
    if isinstance(value, dict):
        return {k: _float16_to_float32(v) for k, v in value.items()}
    return value


class Float16AsCbfloat16:
    """How ``GraphInterpreter`` runs a graph traced in float16 as cbfloat16 (module doc)."""

    def storage_dtype(self, torch_dtype: torch.dtype):
        """The JAX dtype a value of ``torch_dtype`` is held in, and whether it is rounded."""
        if torch_dtype == torch.float16:
            return np.dtype(np.float32), True
        return None, False

    def arguments(self, args, kwargs):
        """A node's arguments with float16 dtype arguments (casts, factories) made float32;
        the result is rounded to cbfloat16 by ``result``."""
        return _float16_to_float32(args), _float16_to_float32(kwargs)

    def result(self, value):
        return round_to_cbfloat16(value.astype(jnp.float32))

    def enter(self, value):
        """A step input or constant: float16 values become cbfloat16 (float32 storage)."""
        if getattr(value, "dtype", None) == jnp.float16:
            return round_to_cbfloat16(value.astype(jnp.float32))
        return value

    def leave(self, value, expected):
        """A step output: float16 in the graph is float16 to torch (beyond its range: inf)."""
        if (
            isinstance(expected, torch.Tensor)
            and expected.dtype == torch.float16
            and value is not None
        ):
            return value.astype(jnp.float16)
        return value


def interpreter_emulation(policy):
    """The interpreter hook for ``policy``: ``Float16AsCbfloat16`` for cbfloat16, else None."""
    if getattr(policy, "compute_dtype", None) == "cbfloat16":
        return Float16AsCbfloat16()
    return None
