"""``SyntheticDataset``: samples generated from a specification, for smoke runs and compile
checks without real data."""

from __future__ import annotations

from typing import Iterator, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.data import IterDataPipe

from jax_backend.errors import CstorchTypeError, CstorchValueError


class SyntheticDataset(IterDataPipe):
    """Yields samples shaped like ``sample_spec``.

    Args:
        sample_spec: a pytree (list, tuple, dict, namedtuple) whose leaves are tensors (cloned
            for every sample) or callables ``f(index) -> tensor``.
        num_samples: how many samples to yield, or None for an endless stream (which has no
            ``len``).
    """

    def __init__(self, sample_spec, num_samples: Optional[int] = None):
        super().__init__()
        self._leaves, self._spec = tree_flatten(sample_spec)
        if not self._leaves:
            raise CstorchValueError(
                "`sample_spec` must be a non-empty pytree of torch.Tensor or callables."
            )
        for leaf in self._leaves:
            if not isinstance(leaf, torch.Tensor) and not callable(leaf):
                raise CstorchValueError(
                    f"`sample_spec` leaves must be torch.Tensor or callables f(index) -> tensor, "
                    f"got a leaf of type {type(leaf).__name__}. Containers may be lists, "
                    "tuples, dicts and namedtuples."
                )
        if isinstance(num_samples, bool) or not (
            num_samples is None or isinstance(num_samples, int)
        ):
            raise CstorchTypeError(
                f"`num_samples` must be a positive integer or None, but got a value "
                f"of type {type(num_samples).__name__}."
            )
        if num_samples is not None and num_samples <= 0:
            raise CstorchValueError(
                f"`num_samples` must be a positive integer, but got {num_samples}."
            )
        self._num_samples = num_samples

    def __iter__(self) -> Iterator:
        index = 0
        while self._num_samples is None or index < self._num_samples:
            leaves = [
                leaf.clone() if isinstance(leaf, torch.Tensor) else leaf(index)
                for leaf in self._leaves
            ]
            yield tree_unflatten(leaves, self._spec)
            index += 1

    def __len__(self) -> int:
        if self._num_samples is None:
            raise CstorchTypeError(
                f"{type(self).__name__} has no length because `num_samples` was not "
                "given (it yields samples forever)."
            )
        return self._num_samples
