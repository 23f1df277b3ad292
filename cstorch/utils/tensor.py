"""Tensor factories of the cstorch API (``cstorch.full``, ``ones``, ``zeros`` and ``*_like``).

On the reference CSX backend these return lazily materialized tensors; here every tensor is
a host tensor until a compiled step uploads it, so they are the plain torch factories (the
``*_like`` variants default to ``other.dtype``)."""

from __future__ import annotations

import torch


def full(shape, value, dtype=None) -> torch.Tensor:
    """A tensor of ``shape`` filled with ``value``."""
    return torch.full(shape, value, dtype=dtype)


def full_like(other: torch.Tensor, value, dtype=None) -> torch.Tensor:
    """A tensor like ``other`` (shape; dtype unless given) filled with ``value``."""
    return torch.full_like(other, value, dtype=dtype or other.dtype)


def ones(shape, dtype=None) -> torch.Tensor:
    """A tensor of ``shape`` filled with ones."""
    return torch.ones(shape, dtype=dtype)


def ones_like(other: torch.Tensor, dtype=None) -> torch.Tensor:
    """A tensor of ones like ``other`` (shape; dtype unless given)."""
    return torch.ones_like(other, dtype=dtype or other.dtype)


def zeros(shape, dtype=None) -> torch.Tensor:
    """A tensor of ``shape`` filled with zeros."""
    return torch.zeros(shape, dtype=dtype)


def zeros_like(other: torch.Tensor, dtype=None) -> torch.Tensor:
    """A tensor of zeros like ``other`` (shape; dtype unless given)."""
    return torch.zeros_like(other, dtype=dtype or other.dtype)
