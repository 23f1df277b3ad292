"""``GMP``: gradual magnitude pruning (https://arxiv.org/abs/1710.01878)."""

from __future__ import annotations

import torch

from cstorch.sparse.dynamic import DynamicSparsityAlgorithm
from cstorch.sparse.utils import Constant, make_mask_topk_sparsity


class GMP(DynamicSparsityAlgorithm):
    """Sparsity follows a (growing) schedule; each update keeps the largest ``|w|``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if isinstance(self.sparsity.default, Constant):
            raise ValueError(
                f"Configured with constant sparsity {self.sparsity.default.value}. This is not "
                "valid, because the sparsity pattern would not change during training. For a "
                "static sparsity pattern, use `algorithm=\"static\".`")

    @torch.no_grad()
    def update_mask(self, p, mask, sparsity):
        return make_mask_topk_sparsity(p.abs(), sparsity, when=self.is_update_step)
