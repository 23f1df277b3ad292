"""Step schedules, step-count arithmetic and batch helpers for data executors."""

from __future__ import annotations

import copy
import dataclasses
from typing import List, Optional

import numpy as np
import torch
from torch.utils._pytree import tree_leaves

from jax_backend.errors import CstorchRuntimeError, CstorchValueError


@dataclasses.dataclass
class Schedule:
    """A set of step indices (0-based) made of non-overlapping ranges.

    As in the reference it is a dataclass of ``intervals`` (kept sorted by start), iterates
    over its steps and has ``len``, ``start``, ``final_step`` and ``next_immediate_step``. One
    deliberate difference: ``range()`` is the flat list of steps (the reference returns one
    ``range`` per interval, which drops each interval's ``include_last`` step), and
    ``next_immediate_step`` past the last step is None rather than an error.
    """

    @dataclasses.dataclass
    class Range:
        """Steps ``start, start + step, ...`` below ``end``, plus ``end - 1`` when
        ``include_last``. Fields may be reassigned after construction (the Model Zoo shifts a
        copy's ``start``)."""

        start: int
        end: int
        step: int
        include_last: bool

        def __post_init__(self):
            if not isinstance(self.start, int) or self.start < 0:
                raise CstorchValueError(
                    f"Range start must be a non-negative int, got {self.start!r}."
                )
            if not isinstance(self.end, int) or self.end <= self.start:
                raise CstorchValueError(
                    f"Range end must be an int greater than start ({self.start}), got {self.end!r}."
                )
            if not isinstance(self.step, int) or self.step < 1:
                raise CstorchValueError(f"Range step must be a positive int, got {self.step!r}.")
            if not isinstance(self.include_last, bool):
                raise CstorchValueError(
                    f"Range include_last must be a bool, got {self.include_last!r}."
                )

        def match(self, index: int) -> bool:
            if not self.start <= index < self.end:
                return False
            return (index - self.start) % self.step == 0 or (
                self.include_last and index == self.end - 1
            )

        def range(self) -> range:
            """The regular steps (without the ``include_last`` extra)."""
            return range(self.start, self.end, self.step)

        def steps(self) -> list:
            values = list(self.range())
            if self.include_last and (not values or values[-1] != self.end - 1):
                values.append(self.end - 1)
            return values

        def __iter__(self):
            return iter(self.steps())

        def __len__(self):
            return len(self.steps())

        @property
        def final_step(self) -> int:
            return self.end - 1 if self.include_last else self.range()[-1]

        def next_immediate_step(self, target: int) -> int:
            """The first step at or after ``target`` (ValueError past the last step)."""
            if target > self.final_step:
                raise CstorchValueError(
                    f"Target {target} is past the last step {self.final_step} of {self}."
                )
            if target <= self.start:
                return self.start
            regular = self.start + -(-(target - self.start) // self.step) * self.step
            return min(regular, self.final_step)

    intervals: List["Schedule.Range"]

    def __post_init__(self):
        for interval in self.intervals:
            if not isinstance(interval, Schedule.Range):
                raise CstorchValueError(
                    f"Schedule intervals must be Schedule.Range objects, got "
                    f"{type(interval).__name__}."
                )
        ordered = sorted(self.intervals, key=lambda r: r.start)
        for a, b in zip(ordered, ordered[1:]):
            if b.start < a.end:
                raise CstorchValueError(f"Schedule intervals must not overlap: {a} and {b}.")
        self.intervals = ordered

    def match(self, index: int) -> bool:
        return any(r.match(index) for r in self.intervals)

    def range(self) -> list:
        return [s for r in self.intervals for s in r.steps()]

    def __iter__(self):
        return iter(self.range())

    def __len__(self):
        return len(self.range())

    @property
    def start(self) -> Optional[int]:
        return self.intervals[0].start if self.intervals else None

    @property
    def final_step(self) -> Optional[int]:
        return self.intervals[-1].final_step if self.intervals else None

    def next_immediate_step(self, target: int) -> Optional[int]:
        return next((s for s in self.range() if s >= target), None)


def checkpoint_schedule(checkpoint_steps, num_steps: int) -> Schedule:
    """The reference's reading of ``DataExecutor(checkpoint_steps=...)``."""
    if checkpoint_steps is None or checkpoint_steps == 0:
        return Schedule([])
    if isinstance(checkpoint_steps, Schedule):
        return copy.deepcopy(checkpoint_steps)
    if (
        isinstance(checkpoint_steps, int)
        and not isinstance(checkpoint_steps, bool)
        and (checkpoint_steps > 0)
    ):
        return Schedule(
            [
                Schedule.Range(
                    start=min(checkpoint_steps - 1, num_steps - 1),
                    end=num_steps,
                    step=checkpoint_steps,
                    include_last=True,
                )
            ]
        )
    raise CstorchValueError(
        f"checkpoint_steps must be None, a non-negative int or a cstorch.utils.data.Schedule, "
        f"got {checkpoint_steps!r}."
    )


def _check_count(name, value, allow_zero=False):
    if value is None:
        return
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        raise CstorchValueError(
            f"{name} must be a {'non-negative' if allow_zero else 'positive'} "
            f"integer, got {value!r}."
        )


def compute_num_steps(
    dataloader,
    initial_step: int = 0,
    num_steps=None,
    max_steps=None,
    num_epochs=None,
    steps_per_epoch=None,
    grad_accum_steps: int = 1,
) -> int:
    """How many steps a run takes, from the combination of limits the reference accepts."""
    if num_epochs is not None and num_steps is not None:
        raise CstorchValueError("Only one of num_epochs and num_steps may be set.")
    _check_count("initial_step", initial_step, allow_zero=True)
    for name, value in [
        ("num_steps", num_steps),
        ("max_steps", max_steps),
        ("num_epochs", num_epochs),
        ("steps_per_epoch", steps_per_epoch),
        ("grad_accum_steps", grad_accum_steps),
    ]:
        _check_count(name, value)
    try:
        length = len(dataloader)
    except TypeError:
        length = None
    if num_epochs is not None and length is None and steps_per_epoch is None:
        raise CstorchValueError(
            "num_epochs needs a dataloader with a known length (or steps_per_epoch)."
        )
    if steps_per_epoch is not None and length is not None and steps_per_epoch > length:
        raise CstorchValueError(
            f"steps_per_epoch ({steps_per_epoch}) is larger than the dataloader length ({length})."
        )
    per_epoch = steps_per_epoch or length
    if per_epoch is not None and grad_accum_steps > per_epoch:
        raise CstorchValueError(
            f"grad_accum_steps ({grad_accum_steps}) is larger than the number of "
            f"steps per epoch ({per_epoch})."
        )
    limits = []
    if num_epochs is not None:
        limits.append(num_epochs * (per_epoch // grad_accum_steps))
    if num_steps is not None:
        limits.append(num_steps)
    if max_steps is not None:
        limits.append(max_steps - initial_step)
    if not limits:
        raise CstorchValueError("One of num_epochs, num_steps or max_steps must be given.")
    result = min(limits)
    if result <= 0:
        raise CstorchRuntimeError(
            f"No steps left to run (initial_step={initial_step}, "
            f"max_steps={max_steps}); nothing to do."
        )
    return result


def infer_batch_size(data, batch_size=None) -> Optional[int]:
    """The leading dimension shared by the batch's tensors (None if there are none)."""
    sizes = {t.shape[0] for t in tree_leaves(data) if isinstance(t, torch.Tensor) and t.ndim}
    if not sizes:
        return batch_size
    if len(sizes) > 1:
        return None
    return sizes.pop()


def from_numpy(array):
    """A torch tensor from a numpy array (copied when read-only); tensors pass through."""
    if isinstance(array, torch.Tensor):
        return array
    if not array.flags.writeable:
        array = array.copy()
    try:
        import ml_dtypes

        if array.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    except ImportError:
        pass
    return torch.from_numpy(array)


def to_numpy(tensor):
    """A numpy array from a torch tensor (bfloat16 as ml_dtypes.bfloat16); arrays pass through."""
    if isinstance(tensor, np.ndarray):
        return tensor
    from jax_backend.dtypes import tensor_to_numpy

    return tensor_to_numpy(tensor)
