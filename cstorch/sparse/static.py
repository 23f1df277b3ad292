"""``Static``: a fixed mask, computed once at initialisation."""

from __future__ import annotations

from typing import Optional

import torch

from cstorch.sparse.base import SparseParameter, SparsityAlgorithm
from jax_backend.errors import CstorchValueError


class Static(SparsityAlgorithm):
    """Constant sparsity ``0 <= sparsity < 1``; the mask never changes."""

    @classmethod
    def check_arguments(cls, **kwargs) -> None:
        sparsity = kwargs.get("sparsity")
        if sparsity is not None:
            if not isinstance(sparsity, float):
                raise CstorchValueError("Static sparsity algorithm only supports constant sparsity")
            if not 0.0 <= sparsity < 1.0:
                raise CstorchValueError(
                    f"Invalid sparsity level {sparsity}. Must be 0.0 <= s < 1.0"
                )
        super().check_arguments(**kwargs)

    def __init__(self, sparsity: Optional[float] = None, **kwargs):
        type(self).check_arguments(sparsity=sparsity)
        self.sparsity_level = sparsity
        super().__init__(sparsity, **kwargs)

    def csx_annotate_sparsity(self, param: SparseParameter) -> None:
        with torch.device("cpu"):
            self.sparsity_level = float(self.sparsity[param.data](step=0))

    def update(self, optimizer=None) -> None:
        for hook in self._target_sparsity_hooks.values():
            hook(self, "*", self.sparsity_level)
        for hook in self._computed_sparsity_hooks.values():
            hook(self, "*", self.sparsity_level)
