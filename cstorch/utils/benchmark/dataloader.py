"""``benchmark_dataloader``: how fast a dataloader produces batches, per epoch and overall."""

from __future__ import annotations

import dataclasses
import resource
import time
from typing import Callable, Dict, Iterable, List, Optional

import torch
from torch.utils._pytree import tree_flatten

from jax_backend.errors import CstorchTypeError, CstorchValueError

PROFILE_ACTIVITIES = ("max_rss",)
"""Extra measurements ``profile_activities`` may ask for at each sampled batch."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one tensor of a batch."""

    shape: tuple
    dtype: torch.dtype

    @staticmethod
    def from_tensor(tensor) -> "TensorSpec":
        if not isinstance(tensor, torch.Tensor):
            raise CstorchTypeError(
                f"The dataloader returned a non-tensor of type {type(tensor).__name__}: {tensor!r}"
            )
        return TensorSpec(tuple(tensor.shape), tensor.dtype)


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    """The structure and tensor specs of a batch."""

    tensors: tuple
    structure: str

    @staticmethod
    def from_batch(batch) -> "BatchSpec":
        leaves, spec = tree_flatten(batch)
        return BatchSpec(tuple(TensorSpec.from_tensor(t) for t in leaves), str(spec))


@dataclasses.dataclass
class BatchSpecOccurence:
    """Where a batch spec first occurred and how often it occurred."""

    epoch_step: int
    epoch: int
    count: int


@dataclasses.dataclass
class BatchMetrics:
    """A sampled batch: its position, the rates (steps/s) and the profiled activities."""

    epoch_step: int
    global_step: int
    local_rate: float
    global_rate: float
    profile_activities: Dict[str, float] = dataclasses.field(default_factory=dict)
    sampling_time_ns: int = dataclasses.field(default_factory=time.time_ns)


@dataclasses.dataclass
class EpochMetrics:
    """One epoch: iterator creation and iteration times (s), steps and sampled batches."""

    iterator_creation: float = 0.0
    iteration_time: float = 0.0
    total_steps: int = 0
    batch_metrics: List[BatchMetrics] = dataclasses.field(default_factory=list)

    @property
    def total_time(self) -> float:
        return self.iterator_creation + self.iteration_time


@dataclasses.dataclass
class Metrics:
    """A whole benchmark: build time (s), epochs, batch specs, total time and rate."""

    dataloader_build_time: float = 0.0
    epoch_metrics: List[EpochMetrics] = dataclasses.field(default_factory=list)
    batch_specs: Dict[BatchSpec, BatchSpecOccurence] = dataclasses.field(default_factory=dict)
    total_time: float = 0.0
    global_rate: float = 0.0
    is_partial: bool = True

    @property
    def total_steps(self) -> int:
        return sum(epoch.total_steps for epoch in self.epoch_metrics)

    @property
    def global_sample_rate(self) -> Optional[float]:
        """Samples/s, when every batch has the same spec and a common leading dimension."""
        if len(self.batch_specs) != 1:
            return None
        sizes = {t.shape[0] if t.shape else None for t in next(iter(self.batch_specs)).tensors}
        if len(sizes) != 1 or None in sizes:
            return None
        return self.global_rate * sizes.pop()


def _profile(activities) -> Dict[str, float]:
    values = {}
    for activity in activities:
        if activity == "max_rss":
            values[activity] = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return values


def benchmark_dataloader(
    input_fn: Callable[..., Iterable],
    num_epochs: Optional[int] = None,
    steps_per_epoch: Optional[int] = None,
    sampling_frequency: Optional[int] = None,
    profile_activities: Optional[List[str]] = None,
    print_metrics: bool = True,
) -> Metrics:
    """Iterates ``input_fn()``'s dataloader and measures it.

    Args:
        input_fn: returns the dataloader (any iterable of batches of tensors).
        num_epochs: epochs to run (default 1).
        steps_per_epoch: batches per epoch (default: the whole dataloader).
        sampling_frequency: record rates every this many steps (default 100; the first step of
            each epoch is always recorded).
        profile_activities: extra measurements per sampled batch, from ``PROFILE_ACTIVITIES``.
        print_metrics: print a summary at the end.
    """
    for name, value in (
        ("num_epochs", num_epochs),
        ("steps_per_epoch", steps_per_epoch),
        ("sampling_frequency", sampling_frequency),
    ):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value <= 0
        ):
            raise CstorchValueError(f"`{name}` must be a positive integer or None, got {value!r}.")
    activities = list(profile_activities or [])
    unknown = [a for a in activities if a not in PROFILE_ACTIVITIES]
    if unknown:
        raise CstorchValueError(
            f"Unknown profile activities {unknown}; valid ones are {list(PROFILE_ACTIVITIES)}."
        )
    num_epochs = num_epochs or 1
    sampling_frequency = sampling_frequency or 100

    metrics = Metrics()
    start = time.perf_counter()
    dataloader = input_fn()
    metrics.dataloader_build_time = time.perf_counter() - start
    global_step = 0
    run_start = time.perf_counter()
    try:
        for epoch in range(num_epochs):
            epoch_metrics = EpochMetrics()
            metrics.epoch_metrics.append(epoch_metrics)
            t0 = time.perf_counter()
            iterator = iter(dataloader)
            epoch_metrics.iterator_creation = time.perf_counter() - t0
            t0 = last = time.perf_counter()
            for step, batch in enumerate(iterator):
                if steps_per_epoch is not None and step >= steps_per_epoch:
                    break
                now = time.perf_counter()
                global_step += 1
                epoch_metrics.total_steps += 1
                spec = BatchSpec.from_batch(batch)
                seen = metrics.batch_specs.get(spec)
                if seen is None:
                    metrics.batch_specs[spec] = BatchSpecOccurence(step, epoch, 1)
                else:
                    seen.count += 1
                if step == 0 or global_step % sampling_frequency == 0:
                    epoch_metrics.batch_metrics.append(
                        BatchMetrics(
                            epoch_step=step,
                            global_step=global_step,
                            local_rate=1.0 / max(now - last, 1e-12),
                            global_rate=global_step / max(now - run_start, 1e-12),
                            profile_activities=_profile(activities),
                        )
                    )
                last = now
            epoch_metrics.iteration_time = time.perf_counter() - t0
        metrics.is_partial = False
    finally:
        metrics.total_time = time.perf_counter() - run_start
        metrics.global_rate = metrics.total_steps / max(metrics.total_time, 1e-12)
        if print_metrics:
            _print(metrics)
    return metrics


def _print(metrics: Metrics) -> None:
    lines = [
        f"Dataloader benchmark{' (partial)' if metrics.is_partial else ''}:",
        f"  build time: {metrics.dataloader_build_time:.4f} s",
        f"  steps: {metrics.total_steps} in {metrics.total_time:.4f} s "
        f"({metrics.global_rate:.2f} steps/s)",
    ]
    if metrics.global_sample_rate is not None:
        lines.append(f"  samples/s: {metrics.global_sample_rate:.2f}")
    for i, epoch in enumerate(metrics.epoch_metrics):
        lines.append(
            f"  epoch {i}: {epoch.total_steps} steps, iterator creation "
            f"{epoch.iterator_creation:.4f} s, iteration {epoch.iteration_time:.4f} s"
        )
    lines.append(f"  unique batch specs: {len(metrics.batch_specs)}")
    print("\n".join(lines))
