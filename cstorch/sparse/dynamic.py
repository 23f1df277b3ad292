"""``DynamicSparsityAlgorithm``: masks recomputed inside the step on an update schedule.

The algorithm's ``step`` (int64) and any schedule state are carried between compiled steps
like parameters, so an update is a ``where(is_update_step, new_mask, mask)`` inside the one
compiled program: no recompilation and no host round trip when masks change.

Differences from cerebras-pytorch 2.10 (on purpose): ``load_state_dict`` restores the
schedules' state (the reference discarded it), and the step only advances on steps whose
update was applied (``cstorch.amp`` skips non-finite steps).
"""

from __future__ import annotations

import os
from abc import abstractmethod
from typing import Optional, Union

import torch

from cstorch.sparse.base import SparseParameter, SparsityAlgorithm
from cstorch.sparse.utils import UpdateScheduleType, make_hyperparam_schedule, make_update_schedule
from jax_backend.errors import CstorchTypeError


class DynamicSparsityAlgorithm(SparsityAlgorithm):
    """Base of algorithms whose masks change during training (GMP, SET, RigL).

    ``update`` is None (every step), ``{"freq": f, "start": s, "stop": e}``,
    ``{"steps": [...]}`` or a function of the step tensor. If step 0 is not an update step,
    training starts dense."""

    @classmethod
    def check_arguments(cls, **kwargs) -> None:
        super().check_arguments(**kwargs)
        if "update" in kwargs:
            make_update_schedule(kwargs["update"])
        for name in ("drop_fraction",):  # (SET's and RigL's schedule)
            if name in kwargs:
                make_hyperparam_schedule(kwargs[name])

    def __init__(
        self,
        sparsity: Union[float, dict, None] = None,
        update: Optional[UpdateScheduleType] = None,
        **kwargs,
    ):
        self._state = {"step": torch.tensor(0, dtype=torch.int64)}
        super().__init__(sparsity=sparsity, **kwargs)
        self.update_schedule = make_update_schedule(update)
        self.starts_sparse = bool(self.update_schedule(torch.tensor(0, dtype=torch.int64)))
        if not self.starts_sparse:
            self.init_method = lambda p, sparsity, **kwargs: torch.ones(
                tuple(p.shape), dtype=torch.bool
            )
        self._advanced_at_apply: set = set()

    @property
    def step(self) -> torch.Tensor:
        """The number of optimizer steps taken (int64 tensor)."""
        return self._state["step"]

    @step.setter
    def step(self, value) -> None:
        self._state["step"] = value

    def sparsify_parameter(self, module, name, param) -> None:
        super().sparsify_parameter(module, name, param)
        if param is None or self.get_sparse_params(param) is None:
            return
        schedule = self.sparsity[param]
        if id(schedule) not in self._advanced_at_apply:
            # As the reference: the schedule takes one update for the initial mask.
            self._advanced_at_apply.add(id(schedule))
            schedule.update(torch.tensor(self.starts_sparse))
            schedule.cache_clear()

    def _unique_schedules(self):
        seen, result = set(), []
        for sparse_param in self.sparse_params.values():
            schedule = self.sparsity[sparse_param.param]
            if id(schedule) not in seen:
                seen.add(id(schedule))
                result.append((sparse_param.name, schedule))
        return result

    @torch.no_grad()
    def update(self, optimizer=None) -> None:
        from cstorch import amp
        from cstorch.optim import Optimizer

        if optimizer is not None and not isinstance(optimizer, Optimizer):
            raise CstorchTypeError(f"Expected a Cerebras Optimizer. Got: {type(optimizer)}")
        increment = amp._compat.finite_increment(optimizer) if optimizer is not None else 1
        self.step += increment
        is_update_step = torch.as_tensor(self.update_schedule(self.step), dtype=torch.bool)
        if optimizer is not None:
            isfinite = amp._compat.isfinite(optimizer)
            if isinstance(isfinite, torch.Tensor):
                is_update_step = is_update_step & isfinite
        self._is_update_step = is_update_step

        params = list(
            self.get_sparse_params(optimizer)
            if optimizer is not None
            else self.sparse_params.values()
        )
        names_of = {}
        for sparse_param in params:
            names_of.setdefault(id(self.sparsity[sparse_param.param]), []).append(sparse_param.name)
        for sparse_param in params:
            p = sparse_param.param
            if p.grad is None:
                continue  # not updated this step: nothing to re-mask
            schedule = self.sparsity[p]
            sparsity = torch.clamp(
                torch.as_tensor(schedule(self.step), dtype=torch.float32), 0.0, 1.0
            )
            schedule.update(is_update_step)
            names = names_of.pop(id(schedule), None)
            if names is not None:
                glob = os.path.commonprefix(names) + "*"
                for hook in self._target_sparsity_hooks.values():
                    hook(self, glob, sparsity)
            mask = sparse_param.mask
            new_mask = torch.where(is_update_step, self.update_mask(p, mask, sparsity), mask)
            sparse_param.mask = new_mask
            if self._computed_sparsity_hooks:
                computed = 1 - new_mask.sum() / new_mask.numel()
                for hook in self._computed_sparsity_hooks.values():
                    hook(self, sparse_param.name, computed)
        for _, schedule in self._unique_schedules() + self._extra_schedules():
            schedule.cache_clear()
        self._is_update_step = None

    @property
    def is_update_step(self) -> torch.Tensor:
        """Whether the current step updates the masks (a bool tensor)."""
        current = getattr(self, "_is_update_step", None)
        if current is None:
            current = torch.as_tensor(self.update_schedule(self.step), dtype=torch.bool)
        return current

    def _extra_schedules(self) -> list:
        """``(name, schedule)`` of hyperparameters besides sparsity (e.g. drop_fraction)."""
        return []

    @abstractmethod
    def update_mask(self, p, mask, sparsity) -> torch.Tensor:
        """The new mask of ``p`` (current ``mask``, target ``sparsity`` tensor)."""

    def csx_annotate_sparsity(self, param: SparseParameter) -> None:
        """Compiler hints on a Cerebras system; nothing to annotate here."""

    # ---------------------------------------------------------------------------- state
    def visit_state(self, f) -> None:
        new = f(self.step)
        if new is not None:
            self.step = new
        for _, schedule in self._unique_schedules() + self._extra_schedules():
            schedule.visit_state(f)

    def state_dict(self) -> dict:
        self._backend.materialize_state()
        sparsity = {}
        for name, schedule in self._unique_schedules():
            state = schedule.state_dict()
            if state:
                sparsity[name] = state
        state = {"step": self.step, "sparsity": sparsity}
        for name, schedule in self._extra_schedules():
            if schedule.state_dict():  # e.g. a cycling drop_fraction (not kept by 2.10)
                state[name] = schedule.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        if "step" not in state_dict:
            raise KeyError(
                f"The state_dict of {type(self).__name__} needs a 'step' entry; got keys "
                f"{sorted(state_dict)}."
            )
        step = torch.as_tensor(state_dict.pop("step"))
        self.step = step.to(torch.int64).clone()
        saved = state_dict.get("sparsity") or {}
        for name, schedule in self._unique_schedules():
            if name in saved:
                schedule.load_state_dict(dict(saved[name]))
        for name, schedule in self._extra_schedules():
            if name in state_dict:
                schedule.load_state_dict(dict(state_dict[name]))

    def _cstorch_state_slots(self) -> list:
        from jax_backend import Slot

        return [Slot(self._state, "step")]
