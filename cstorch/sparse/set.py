"""``SET``: sparse evolutionary training (https://arxiv.org/abs/1707.04780).

Regrowth scores are uniform random numbers drawn inside the compiled step from the step's
JAX key (seeded from torch's generator): runs are repeatable under ``torch.manual_seed``, but
the regrown positions differ from the reference's torch RNG stream.
"""

from __future__ import annotations

import torch

from cstorch.sparse.dynamic import DynamicSparsityAlgorithm
from cstorch.sparse.utils import (
    HyperParameterScheduleType,
    make_hyperparam_schedule,
    make_mask_drop_minimum,
    make_mask_grow_maximum,
)


class SET(DynamicSparsityAlgorithm):
    """Constant sparsity; each update drops the ``drop_fraction`` smallest ``|w|`` of the
    present connections and regrows as many at random positions."""

    def __init__(self, drop_fraction: HyperParameterScheduleType = 0.3, **kwargs):
        super().__init__(**kwargs)
        self.drop_fraction = make_hyperparam_schedule(drop_fraction)

    def _extra_schedules(self):
        return [("drop_fraction", self.drop_fraction)]

    @torch.no_grad()
    def update_mask(self, p, mask, sparsity):
        drop_fraction = self.drop_fraction(self.step)
        self.drop_fraction.update(self.is_update_step)
        when = self.is_update_step
        dropped, kept = make_mask_drop_minimum(p.abs(), mask, drop_fraction, when=when)
        return make_mask_grow_maximum(torch.rand_like(p), dropped, sparsity, kept, when=when)
