"""1.8/1.9 ``cstorch.utils.data``.

``DataLoader(input_fn, *args, num_steps=, num_epochs=, steps_per_epoch=, max_steps=,
initial_step=0, **kwargs)`` is the 1.8 loader that drives steps itself::

    for epoch in range(dataloader.num_epochs):
        for batch in dataloader:
            loss = training_step(batch)

Each epoch's iteration runs a cstorch ``DataExecutor`` for that epoch's steps (checkpointing
every ``configure(checkpoint_steps=)`` steps, running step closures after every step). Given
none of the step keywords it is the 1.9 loader, which a ``DataExecutor`` iterates.

``num_steps`` (and ``max_steps``) count the whole run: without ``num_epochs`` or
``steps_per_epoch`` the run is one epoch of ``min(num_steps, max_steps - initial_step)``
steps, and the input's batches repeat as often as that needs (a 20-batch loader with
``num_steps=30`` gives 30 batches in one pass, so a script that iterates the loader once
reaches every step, checkpoint and evaluation it asked for).

``compute_num_steps`` is 2.x's, except that ``num_steps`` and ``num_epochs`` may both be
given, as 1.9's evaluation passes them (``num_steps=eval_steps, num_epochs=1``): the run
stops at whichever limit comes first (2.x refuses the pair).
"""

from __future__ import annotations

import math

from cstorch.utils.data import *  # noqa: F403
from cstorch.utils.data import (
    DataExecutor as DataExecutor,
    DataLoader as _DataLoader,
    compute_num_steps as _compute_num_steps_2x,
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
    common = dict(
        initial_step=initial_step,
        max_steps=max_steps,
        steps_per_epoch=steps_per_epoch,
        grad_accum_steps=grad_accum_steps,
    )
    if num_steps is not None and num_epochs is not None:
        return min(
            _compute_num_steps_2x(dataloader, num_steps=num_steps, **common),
            _compute_num_steps_2x(dataloader, num_epochs=num_epochs, **common),
        )
    return _compute_num_steps_2x(dataloader, num_steps=num_steps, num_epochs=num_epochs, **common)


_STEP_KEYS = ("num_steps", "num_epochs", "steps_per_epoch", "max_steps")


class DataLoader(_DataLoader):
    def __init__(
        self,
        input_fn,
        *args,
        num_steps=None,
        num_epochs=None,
        steps_per_epoch=None,
        max_steps=None,
        initial_step: int = 0,
        **kwargs,
    ):
        super().__init__(input_fn, *args, **kwargs)
        self._limits = dict(
            num_steps=num_steps,
            num_epochs=num_epochs,
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
        )
        self.initial_step = initial_step
        self.drives_steps = any(v is not None for v in self._limits.values())
        self._epochs_done = 0
        self._in_executor = False
        self._total = None

    @property
    def total_steps(self) -> int:
        if self._total is None:
            self._total = compute_num_steps(self, initial_step=self.initial_step, **self._limits)
        return self._total

    @property
    def steps_per_epoch(self) -> int:
        per_epoch = self._limits["steps_per_epoch"]
        if per_epoch is None and self._limits["num_epochs"] is None:
            return self.total_steps  # a step budget: one pass, batches repeated as needed
        try:
            length = len(self)
        except TypeError:
            length = None
        if per_epoch is None:
            per_epoch = length if length is not None else self.total_steps
        return min(per_epoch, self.total_steps)

    @property
    def num_epochs(self) -> int:
        if not self.drives_steps:
            return 1
        return math.ceil(self.total_steps / self.steps_per_epoch)

    def __iter__(self):
        if not self.drives_steps or self._in_executor:
            yield from super().__iter__()
            return
        from cerebras_pytorch.experimental._configure import settings

        done = self._epochs_done * self.steps_per_epoch
        steps = min(self.steps_per_epoch, self.total_steps - done)
        if steps <= 0:
            raise RuntimeError(
                f"The DataLoader already ran its {self.total_steps} steps "
                f"({self.num_epochs} epochs); iterate it num_epochs times."
            )
        executor = DataExecutor(
            self, num_steps=steps, checkpoint_steps=settings().get("checkpoint_steps") or None
        )
        self._in_executor = True
        try:
            for batch in executor:
                yield batch
        finally:
            self._in_executor = False
            self._epochs_done += 1
