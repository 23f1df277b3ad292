"""``GMP``: gradual magnitude pruning (https://arxiv.org/abs/1710.01878)."""

from __future__ import annotations

import torch

from cstorch.sparse.dynamic import DynamicSparsityAlgorithm
from cstorch.sparse.utils import Constant, make_mask_topk_sparsity
from jax_backend.errors import CstorchValueError


class GMP(DynamicSparsityAlgorithm):
    """Sparsity follows a (growing) schedule; each update keeps the largest ``|w|``."""

    @classmethod
    def check_arguments(cls, **kwargs) -> None:
        super().check_arguments(**kwargs)
        sparsity = kwargs.get("sparsity")
        if isinstance(sparsity, (int, float)) and not isinstance(sparsity, bool):
            cls._refuse_constant(sparsity)

    @staticmethod
    def _refuse_constant(value):
        raise CstorchValueError(
            f"Configured with constant sparsity {value}. This is not valid, because the "
            "sparsity pattern would not change during training. For a static sparsity "
            'pattern, use `algorithm="static".`'
        )

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if isinstance(self.sparsity.default, Constant):
            self._refuse_constant(self.sparsity.default.value)

    @torch.no_grad()
    def update_mask(self, p, mask, sparsity):
        return make_mask_topk_sparsity(p.abs(), sparsity, when=self.is_update_step)
