"""Builds (or takes) the schedulers; saves and restores their state."""

from __future__ import annotations

from collections.abc import Iterable

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback


class SchedulersCallback(CoreCallback):
    """``schedulers``: a scheduler, a function ``optimizer -> scheduler``, or a list of them."""

    def __init__(self, schedulers=None):
        if schedulers is None:
            schedulers = []
        elif not isinstance(schedulers, Iterable):
            schedulers = [schedulers]
        self.schedulers = list(schedulers)

    def setup(self, trainer):
        trainer.schedulers = []
        if trainer.optimizer is None:
            return
        for item in self.schedulers:
            if isinstance(item, cstorch.optim.scheduler.Scheduler):
                scheduler = item
            elif callable(item):
                scheduler = item(trainer.optimizer)
                if not isinstance(scheduler, cstorch.optim.scheduler.Scheduler):
                    raise TypeError(
                        f"A scheduler factory returned {type(scheduler).__name__}; it must "
                        "return a cstorch.optim.scheduler.Scheduler."
                    )
            else:
                raise TypeError(
                    f"Expected each scheduler to be a cstorch scheduler or a function of the "
                    f"optimizer returning one, got {type(item).__name__}."
                )
            trainer.schedulers.append(scheduler)
        keys = [
            (s.param_group_key, getattr(s, "param_group_tags", None)) for s in trainer.schedulers
        ]
        for i, (key, tags) in enumerate(keys):
            for other_key, other_tags in keys[i + 1 :]:
                if key == other_key and (
                    tags is None or other_tags is None or set(tags) & set(other_tags)
                ):
                    raise RuntimeError(
                        f"Two schedulers update the param-group key {key!r} of the same param "
                        "groups; give them disjoint param_group_tags or different keys."
                    )

    def on_save_checkpoint(self, trainer, state_dict):
        if trainer.schedulers:
            state_dict["schedulers"] = [s.state_dict() for s in trainer.schedulers]

    def on_load_checkpoint(self, trainer, state_dict):
        if not trainer.schedulers:
            return
        if "schedulers" in state_dict:
            if "lr_scheduler" in state_dict:
                raise RuntimeError(
                    "The checkpoint has both `schedulers` and the legacy "
                    "`lr_scheduler` key; it can have only one."
                )
            saved = state_dict["schedulers"]
            if len(saved) != len(trainer.schedulers):
                raise RuntimeError(
                    f"The checkpoint has state for {len(saved)} schedulers but the Trainer has "
                    f"{len(trainer.schedulers)}."
                )
            for scheduler, state in zip(trainer.schedulers, saved):
                scheduler.load_state_dict(state)
        elif "lr_scheduler" in state_dict:
            lr = [
                s
                for s in trainer.schedulers
                if isinstance(s, cstorch.optim.lr_scheduler.LRScheduler)
            ]
            if len(lr) != 1:
                raise RuntimeError(
                    f"The checkpoint holds one legacy `lr_scheduler` but the Trainer has "
                    f"{len(lr)} LR schedulers; cannot tell which one it belongs to."
                )
            lr[0].load_state_dict(state_dict["lr_scheduler"])
        else:
            trainer.logger.info(
                "The checkpoint has no scheduler state; schedulers start from their initial state."
            )
            return
        trainer.logger.info("Scheduler state found in checkpoint and loaded successfully.")
