"""``half_dtype_instance``: the half-precision dtype that Model Zoo 1.x models cast to.

``half_dtype_instance.half_dtype`` is ``torch.bfloat16`` once ``use_bfloat16`` is set (the
runner sets it from ``model.use_bfloat16``), else ``torch.float16``.
"""

import torch


class HalfDtype:
    def __init__(self):
        self.use_bfloat16 = False

    @property
    def half_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.use_bfloat16 else torch.float16


half_dtype_instance = HalfDtype()
