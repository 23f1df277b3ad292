"""``Scope``: a module marking a named scope of the graph (identity in value)."""

from __future__ import annotations

import torch

from cstorch.nn import functional as F


class Scope(torch.nn.Module):
    """``forward(x)`` begins scope ``scope_name`` after ``x``; ``exit(x)`` ends it."""

    def __init__(self, scope_name):
        super().__init__()
        self._scope_name = scope_name

    def forward(self, input):
        return F.enter_scope(input, self._scope_name)

    def exit(self, input):
        return F.exit_scope(input, self._scope_name)
