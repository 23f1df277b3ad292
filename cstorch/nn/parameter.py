"""``Parameter`` and ``Buffer``: the tensor types cerebras-pytorch gives module state.

On a Cerebras system they wrap tensors whose storage lives on the appliance. Here all state
is a host tensor between steps (its device copy is managed by the backend), so they are thin
subclasses that behave as ``torch.nn.Parameter`` and ``torch.Tensor``.
"""

from __future__ import annotations

import torch


class Parameter(torch.nn.Parameter):
    """A module parameter (``torch.nn.Parameter`` semantics)."""

    def __new__(cls, data=None):
        if data is None:
            data = torch.empty(0)
        if isinstance(data, Parameter):
            return data
        return torch.Tensor._make_subclass(cls, data, True)


class Buffer(torch.Tensor):
    """A module buffer (plain tensor semantics, ``requires_grad`` kept from ``data``)."""

    def __new__(cls, data=None):
        if data is None:
            data = torch.empty(0)
        if isinstance(data, Buffer):
            return data
        return torch.Tensor._make_subclass(cls, data, data.requires_grad)
