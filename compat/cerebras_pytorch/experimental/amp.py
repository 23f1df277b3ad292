"""1.8/1.9 ``cstorch.amp``: loss scaling, ``optimizer_step`` and ``use_bfloat16``."""

from cstorch.amp import *  # noqa: F403
from cstorch.amp import GradScaler, optimizer_step, set_half_dtype  # noqa: F401


def use_bfloat16(use: bool = True):
    """1.9: choose bfloat16 (True) or float16 (False) as the half dtype of mixed precision.
    The 2.3+ spelling is ``cstorch.amp.set_half_dtype("bfloat16")``."""
    set_half_dtype("bfloat16" if use else "float16")
