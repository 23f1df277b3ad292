"""``half_dtype_instance``: the half-precision dtype that Model Zoo 1.x models cast to.

It is a view of cstorch's own half-precision setting (``cstorch.amp.set_half_dtype``), not a
second copy: ``half_dtype`` is ``torch.bfloat16`` when that setting is bfloat16, else
``torch.float16``; setting ``use_bfloat16`` (the runner does, from ``model.use_bfloat16``)
picks the dtype without switching mixed precision on or off.
"""

import torch

from cstorch.backend import precision


class HalfDtype:
    @property
    def use_bfloat16(self) -> bool:
        return precision.get_half_dtype_str() == "bfloat16"

    @use_bfloat16.setter
    def use_bfloat16(self, value: bool) -> None:
        if bool(value) == self.use_bfloat16:
            return  # cbfloat16 stays cbfloat16 (a float16 format) when asked for no bfloat16
        # chooses the dtype only: mixed precision stays as it was, or the backend's default
        precision.use_bfloat16(bool(value))

    @property
    def half_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.use_bfloat16 else torch.float16


half_dtype_instance = HalfDtype()
