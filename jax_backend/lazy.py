"""``LazyTensor``: a torch tensor whose value is a JAX array still being computed.

A compiled step returns its outputs as lazy tensors so that the Python loop can run ahead
of the device (asynchronous dispatch). The first time torch needs the value (any torch op,
``.item()``, ``print``, ``numpy()``) the array is copied to host once and cached.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from jax_backend.dtypes import array_to_tensor, to_torch_dtype


class LazyTensor(torch.Tensor):
    """A CPU tensor backed by a JAX array; materialized on first use."""

    _array: Any  # the JAX array
    _value: torch.Tensor | None  # its torch copy, once made

    @staticmethod
    def __new__(cls, array):
        shape = tuple(array.shape)
        dtype = to_torch_dtype(array.dtype)
        tensor = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=dtype, device="cpu", requires_grad=False
        )
        tensor._array = array
        tensor._value = None
        return tensor

    @property
    def jax_array(self):
        return self._array

    def materialize(self) -> torch.Tensor:
        if self._value is None:
            self._value = array_to_tensor(self._array)
        return self._value

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda x: x.materialize() if isinstance(x, LazyTensor) else x  # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))

    def __repr__(self, *, tensor_contents=None):
        return repr(self.materialize())

    def __format__(self, spec):
        return format(self.materialize(), spec)

    def numpy(self, *, force=False):
        return self.materialize().numpy()

    def tolist(self):
        return self.materialize().tolist()

    def __array__(self, dtype=None, copy=None):
        array = self.materialize().numpy()
        return array if dtype is None else array.astype(dtype)

    def __reduce_ex__(self, protocol):
        return self.materialize().__reduce_ex__(protocol)


def materialize(value):
    """Replaces lazy tensors in a pytree by plain torch tensors."""
    return tree_map(lambda x: x.materialize() if isinstance(x, LazyTensor) else x, value)
