"""``DistributedSampler``: shuffling, batching, resuming and sharding of map-style datasets.

The sample order depends only on the seed and the epoch, not on how many systems or workers
stream the data, so a run can be resumed (``set_state``) at any sample and reproduce the
order it would have had.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterable, Optional

import torch

from cstorch.backend import use_cs
from jax_backend.errors import CstorchRuntimeError, CstorchValueError

pad_index = object()
"""Placeholder index filling the last batch when ``pad_last=True``."""


class DistributedSampler(torch.utils.data.Sampler):
    """Samples indices of ``data_source`` (shuffled per epoch), optionally in batches.

    Args:
        data_source: the map-style dataset.
        shuffle: shuffle each epoch (with a generator seeded by ``seed + epoch``).
        seed: shuffling seed; None draws one from torch's default generator (so
            ``torch.manual_seed`` makes the order reproducible).
        start_index: the number of samples already consumed (resume point).
        shard: split global batches across the streamers (one streamer on a single host).
        batch_size: yield lists of indices of this (global) size; None yields single indices.
        drop_last: carry an incomplete final batch over to the next epoch instead of yielding
            it.
        num_samples: samples per logical epoch (the dataset is cut or repeated); None means
            ``len(data_source)``.
        pad_last: with ``drop_last=False``, pad the last batch with ``pad_index``.
    """

    def __init__(
        self,
        data_source,
        shuffle: bool = True,
        seed: Optional[int] = None,
        start_index: int = 0,
        shard: bool = True,
        batch_size: Optional[int] = None,
        drop_last: bool = True,
        num_samples: Optional[int] = None,
        pad_last: bool = False,
    ):
        if use_cs() and not drop_last and not pad_last:
            raise CstorchValueError(
                "Running on CSX requires all batches to have the same size; drop_last=False "
                "with pad_last=False may yield a smaller last batch. Set drop_last=True or "
                "pad_last=True."
            )
        if use_cs() and batch_size is None and shard:
            raise CstorchValueError(
                "Running on CSX with shard=True needs batch_size (the global batch size)."
            )
        if seed is None and shuffle:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        self.kwargs = dict(
            data_source=data_source,
            shuffle=shuffle,
            seed=seed,
            shard=shard,
            batch_size=batch_size,
            drop_last=drop_last,
            num_samples=num_samples,
            pad_last=pad_last,
        )
        self.sampler = ShuffleSampler(
            data_source,
            num_samples=num_samples,
            shuffle=shuffle,
            seed=seed,
            start_index=start_index,
        )
        if batch_size is not None:
            self.sampler = BatchSampler(self.sampler, batch_size, drop_last, pad_last)
        if shard:
            self.sampler = ShardedSampler(self.sampler)

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self):
        return len(self.sampler)

    def set_state(self, start_index: int) -> None:
        """Continues from ``start_index`` samples streamed in a previous run."""
        self.__init__(**self.kwargs, start_index=start_index)


class ShuffleSampler(torch.utils.data.Sampler):
    """Indices of one logical epoch at a time, shuffled or in order, starting mid-epoch."""

    def __init__(
        self,
        data_source,
        num_samples: Optional[int] = None,
        shuffle: bool = True,
        seed: Optional[int] = None,
        start_index: int = 0,
    ):
        self._data_source = data_source
        self._num_samples = num_samples
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise CstorchValueError(
                f"num_samples should be a positive integer value, but got "
                f"num_samples={self.num_samples}."
            )
        self._frozen_num_samples = self.num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = start_index // self.num_samples
        self.start_index = start_index - self.epoch * self.num_samples

    @property
    def num_samples(self) -> int:
        return len(self._data_source) if self._num_samples is None else self._num_samples

    def _permutation(self) -> torch.Tensor:
        size = len(self._data_source)
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        if self.num_samples <= size:
            return torch.randperm(size, generator=generator)[: self.num_samples]
        repeats = math.ceil(self.num_samples / size)
        pool = torch.cat(
            [torch.arange(size)] * (repeats - 1) + [torch.randperm(size, generator=generator)]
        )[: self.num_samples]
        return pool[torch.randperm(self.num_samples, generator=generator)]

    def __iter__(self):
        if self.num_samples != self._frozen_num_samples:
            raise CstorchRuntimeError(
                f"The data source must keep its length every epoch: it was "
                f"{self._frozen_num_samples}, now {self.num_samples}."
            )
        if self.shuffle:
            yield from self._permutation()[self.start_index :].tolist()
        else:
            size = len(self._data_source)
            yield from (i % size for i in range(self.start_index, self.num_samples))
        self.epoch += 1
        self.start_index = 0

    def __len__(self):
        return self.num_samples - self.start_index


class BatchSampler(torch.utils.data.Sampler):
    """Groups indices into batches; with ``drop_last`` the incomplete tail of an epoch starts
    the next epoch's first batch instead of being lost."""

    def __init__(self, sampler: Iterable, batch_size: int, drop_last: bool, pad_last: bool):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise CstorchValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size!r}."
            )
        if not isinstance(drop_last, bool):
            raise CstorchValueError(
                f"drop_last should be a boolean value, but got drop_last={drop_last!r}."
            )
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.pad_last = pad_last
        self.leftover = []
        if len(sampler) < batch_size:
            self.leftover = list(sampler)

    def __iter__(self):
        if self.drop_last:
            indices = itertools.chain(self.leftover, self.sampler)
            self.leftover = []
            while True:
                batch = list(itertools.islice(indices, self.batch_size))
                if len(batch) < self.batch_size:
                    self.leftover = batch
                    return
                yield batch
        batch = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch:
            if self.pad_last:
                batch += [pad_index] * (self.batch_size - len(batch))
            yield batch

    def __len__(self):
        if self.drop_last:
            return (len(self.sampler) + len(self.leftover)) // self.batch_size
        return math.ceil(len(self.sampler) / self.batch_size)


class ShardedSampler(torch.utils.data.Sampler):
    """Gives this streamer its share of each global batch: on a single host (one streamer,
    one worker per system) every batch whole."""

    def __init__(self, data_source: Iterable):
        from cstorch.distributed import service_resolver

        spec = service_resolver().cluster_spec
        task = spec.task()
        self._data_source = data_source
        self._num_groups = max(1, spec.num_workers_per_csx)
        self._group = task.local_rank
        self._num_csx = spec.num_csx
        self._wse = task.wse_id

    def __iter__(self):
        for i, batch in enumerate(self._data_source):
            if i % self._num_groups != self._group:
                continue
            if self._num_csx == 1 or not isinstance(batch, list):
                yield batch
            else:
                bounds = [len(batch) * k // self._num_csx for k in range(self._num_csx + 1)]
                yield batch[bounds[self._wse] : bounds[self._wse + 1]]

    def __len__(self):
        total = len(self._data_source)
        return total // self._num_groups + (1 if self._group < total % self._num_groups else 0)
