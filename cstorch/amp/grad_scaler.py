"""``GradScaler``: static and dynamic loss scaling, computed inside the compiled step.

With dynamic loss scaling (``loss_scale="dynamic"``), ``step`` checks the global gradient
norm; if it is not finite the optimizer update is skipped in the graph — every parameter and
optimizer-state tensor keeps its old value (``torch.where(isfinite, new, old)``) and schedulers
of that optimizer do not advance — and ``update`` halves the scale. After more than
``steps_per_increase`` clean steps the scale doubles. All of this is tensor arithmetic, so it
runs on the device with no host round trip.

Differs from cerebras-pytorch 2.10 on CPU/GPU, where ``scale`` returns the loss unchanged and
``state_dict()`` is empty: here every backend behaves as the reference's CSX backend does.
"""

from __future__ import annotations

import enum
import warnings
import weakref
from types import SimpleNamespace
from typing import Union

import torch

from cstorch.backend import current_backend_impl, precision
from jax_backend import Slot
from jax_backend.errors import CstorchRuntimeError, CstorchValueError


class OptState(enum.Enum):
    READY = enum.auto()
    SCALED = enum.auto()
    UNSCALED = enum.auto()
    STEPPED = enum.auto()


def setup_optimizer(optimizer) -> None:
    """Gives an optimizer the per-step loss-scaling bookkeeping (``_amp_stash``)."""
    if not hasattr(optimizer, "_amp_stash"):
        optimizer._amp_stash = SimpleNamespace(state=OptState.READY, isfinite=None)


def _f32(value):
    return torch.tensor(value, dtype=torch.float32)


class GradScaler:
    """Loss scaling for half-precision training: ``scaler.scale(loss).backward()``, then
    ``cstorch.amp.optimizer_step(loss, optimizer, scaler)`` (or ``scaler.unscale_``,
    ``scaler.step``, ``scaler.update``). ``loss_scale="dynamic"`` halves the scale and skips the
    update on a step whose gradients overflow, inside the compiled step; a number is a static
    scale."""

    def __init__(
        self,
        loss_scale: Union[str, float] = None,
        init_scale: float = None,
        steps_per_increase: int = None,
        min_loss_scale: float = None,
        max_loss_scale: float = None,
        overflow_tolerance: float = 0.0,
        max_gradient_norm: float = None,
    ):
        default_max = 2.0**31 if precision.get_half_dtype_str() == "cbfloat16" else 2.0**15
        loss_scale = loss_scale or 1.0
        init_scale = init_scale or default_max
        steps_per_increase = steps_per_increase or 2000
        min_loss_scale = min_loss_scale or 2.0**-14
        max_loss_scale = max_loss_scale or default_max
        self.backend = current_backend_impl()
        self.dynamic = loss_scale == "dynamic"
        if self.dynamic:
            if min_loss_scale < 2.0**-14:
                raise CstorchValueError(f"min_loss_scale too small: {min_loss_scale} < 2**-14.")
            if overflow_tolerance < 0:
                raise CstorchValueError(
                    f"overflow_tolerance must be >= 0, got {overflow_tolerance}."
                )
            if max_gradient_norm:
                warnings.warn(
                    "Using global gradient clipping built into GradScaler is "
                    "deprecated. Use torch.nn.utils.clip_grad_norm_",
                    stacklevel=2,
                )
            self._loss_scale = _f32(min(max_loss_scale, init_scale))
            self._steps_since_rescale = torch.tensor(0, dtype=torch.int64)
            self._overflows_since_rescale = torch.tensor(0, dtype=torch.int64)
            self._num_skipped_steps = torch.tensor(0, dtype=torch.int64)
        else:
            if not isinstance(loss_scale, (int, float)) or isinstance(loss_scale, bool):
                raise CstorchValueError(
                    f'loss_scale must be a number or "dynamic", got {loss_scale!r}.'
                )
            self._loss_scale = float(loss_scale)
            max_gradient_norm = None
        self._overflow_tolerance = overflow_tolerance
        self._max_gradient_norm = max_gradient_norm
        self._max_loss_scale = max_loss_scale
        self._min_loss_scale = min_loss_scale
        self._steps_per_increase = steps_per_increase
        self._squared_norms = []  # per-step: squared grad norms gathered while unscaling
        self.isfinite = None if self.dynamic else True
        self.global_norm = None
        # Optimizers unscaled or stepped through this scaler, registered with the backend or
        # not yet (a torch optimizer is adopted when the capture meets its step, which ends
        # that capture half way: its bookkeeping is reset with the registered ones').
        self._seen_optimizers = weakref.WeakSet()
        self.backend.setup_grad_scaler(self)
        for optimizer in self.backend.optimizer_registry:
            setup_optimizer(optimizer)

    # ------------------------------------------------------------------------- state
    _STATE = (
        "_loss_scale",
        "_steps_since_rescale",
        "_overflows_since_rescale",
        "_num_skipped_steps",
    )

    def _cstorch_state_slots(self):
        return [
            Slot(self.__dict__, name)
            for name in self._STATE
            if isinstance(self.__dict__.get(name), torch.Tensor)
        ]

    def state_dict(self, destination=None):
        self.backend.materialize_state()
        if not self.dynamic:
            return {"loss_scale": self._loss_scale}
        return {
            "loss_scale": self._loss_scale,
            "steps_since_rescale": self._steps_since_rescale,
            "overflows_since_rescale": self._overflows_since_rescale,
            "num_skipped_steps": self._num_skipped_steps,
        }

    def load_state_dict(self, state_dict):
        for key in (
            "loss_scale",
            "steps_since_rescale",
            "overflows_since_rescale",
            "num_skipped_steps",
        ):
            if key not in state_dict:
                continue
            name = f"_{key}"
            current, value = getattr(self, name, None), state_dict[key]
            if isinstance(current, torch.Tensor):
                value = torch.as_tensor(value, dtype=current.dtype).clone()
            setattr(self, name, value)

    def get_scale(self):
        return self._loss_scale

    def get_non_clamped_scale(self):
        return self._loss_scale

    def get_num_skipped_steps(self):
        if not self.dynamic:
            return torch.tensor(0, dtype=torch.int64)
        return self._num_skipped_steps

    # ------------------------------------------------------------------------- steps
    def _optimizers(self):
        optimizers = self.backend.optimizer_registry
        for optimizer in optimizers:
            setup_optimizer(optimizer)
        return optimizers

    def scale(self, loss: torch.Tensor):
        """``loss.float() * scale`` (just ``loss.float()`` for a static scale of 1)."""
        if not self.dynamic and self._loss_scale == 1.0:
            for optimizer in self._optimizers():
                optimizer._amp_stash.state = OptState.UNSCALED
            return loss.float()
        for optimizer in self._optimizers():
            if optimizer._amp_stash.state == OptState.READY:
                optimizer._amp_stash.state = OptState.SCALED
            elif optimizer._amp_stash.state != OptState.SCALED:
                raise CstorchRuntimeError(
                    "Optimizer parameter gradients already scaled; call "
                    "update() after step() before scaling the next loss."
                )
        return loss.float() * self._loss_scale

    def unscale_(self, optimizer):
        """Divides the optimizer's gradients by the scale, in place."""
        setup_optimizer(optimizer)
        self._seen_optimizers.add(optimizer)
        state = optimizer._amp_stash.state
        if state == OptState.UNSCALED:
            return
        if state == OptState.STEPPED:
            raise CstorchRuntimeError("unscale_() is being called after step().")
        if not self.dynamic and self._loss_scale == 1.0:
            optimizer._amp_stash.state = OptState.UNSCALED
            return
        inv_scale = _f32(1.0) / self._loss_scale if self.dynamic else _f32(1.0 / self._loss_scale)
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(inv_scale)
                        if self.dynamic:
                            self._squared_norms.append(torch.sum(p.grad.float() * p.grad.float()))
        optimizer._amp_stash.state = OptState.UNSCALED

    def clip_gradients_and_return_isfinite(self, optimizers):
        """Whether this step's (unscaled) gradients are finite, from their global L2 norm;
        also applies the deprecated built-in clipping (``max_gradient_norm``) to
        ``optimizers``' gradients."""
        if not self._squared_norms:
            return torch.tensor(True)
        self.global_norm = torch.sqrt(torch.sum(torch.stack(self._squared_norms)))
        isfinite = self.global_norm < _f32(float("inf"))
        if self._max_gradient_norm:
            coef = _f32(self._max_gradient_norm) / (self.global_norm + 1e-6)
            coef = torch.where(coef < 1, coef, 1.0)
            with torch.no_grad():
                for optimizer in optimizers:
                    for group in optimizer.param_groups:
                        for p in group["params"]:
                            if p.grad is not None:
                                p.grad.mul_(coef)
        return isfinite

    def step(self, optimizer, *args, **kwargs):
        """Unscales (if needed) and steps; with dynamic scaling only if the grads are finite."""
        setup_optimizer(optimizer)
        self._seen_optimizers.add(optimizer)
        if optimizer._amp_stash.state == OptState.STEPPED:
            raise CstorchRuntimeError("step() has already been called since the last update().")
        for other in self._optimizers():
            if other._amp_stash.state in (OptState.READY, OptState.SCALED):
                self.unscale_(other)
        if self.dynamic and self.isfinite is None:
            self.isfinite = self.clip_gradients_and_return_isfinite(self._optimizers())
        optimizer._amp_stash.isfinite = self.isfinite if self.dynamic else None
        result = self.step_if_finite(optimizer, *args, **kwargs)
        optimizer._amp_stash.state = OptState.STEPPED
        return result

    def step_if_finite(self, optimizer, *args, **kwargs):
        """``optimizer.step()``, kept only where this step's gradients were finite."""
        if not self.dynamic or self.isfinite is None:
            return optimizer.step(*args, **kwargs)
        tensors = [p for group in optimizer.param_groups for p in group["params"]]
        tensors += [
            v
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ]
        with torch.no_grad():
            saved = [t.detach().clone() for t in tensors]
        result = optimizer.step(*args, **kwargs)
        with torch.no_grad():
            for tensor, old in zip(tensors, saved):
                tensor.copy_(torch.where(self.isfinite, tensor, old))
        return result

    def update(self, new_scale=None):
        """Adjusts a dynamic scale after all optimizers have stepped (cerebras DLS rule)."""
        if new_scale:
            raise CstorchValueError(
                "cstorch.amp.GradScaler does not support providing a `new_scale`"
            )
        if self.dynamic:
            self.update_scale(self._optimizers())
        self._squared_norms = []
        self.isfinite = None if self.dynamic else True
        for optimizer in self._optimizers():
            optimizer._amp_stash.state = OptState.READY

    def update_scale(self, optimizers):
        """The cerebras DLS rule: halve the scale when the overflow ratio exceeds the
        tolerance, double it after ``steps_per_increase`` clean steps, clamp to [min, max]."""
        if not self.dynamic:
            return
        if self.isfinite is None:
            self.isfinite = self.clip_gradients_and_return_isfinite(optimizers)
        finite = self.isfinite.long()
        with torch.no_grad():
            self._num_skipped_steps.add_(1 - finite)
            self._steps_since_rescale.add_(1)
            self._overflows_since_rescale.add_(1 - finite)
            ratio = self._overflows_since_rescale.float() / self._steps_since_rescale.float()
            decrease = (_f32(self._overflow_tolerance) < ratio).long()
            self._loss_scale.div_((1 + decrease).float())
            self._overflows_since_rescale.mul_(1 - decrease)
            self._steps_since_rescale.mul_(1 - decrease)
            increase = (torch.tensor(self._steps_per_increase) < self._steps_since_rescale).long()
            self._loss_scale.mul_((1 + increase).float())
            self._overflows_since_rescale.mul_(1 - increase)
            self._steps_since_rescale.mul_(1 - increase)
            self._loss_scale.copy_(
                torch.clamp(self._loss_scale, self._min_loss_scale, self._max_loss_scale)
            )

    def _forget_traced_values(self):
        """Drops per-step Python values after a trace: they hold traced tensors."""
        self._squared_norms = []
        self.isfinite = None if self.dynamic else True
        self.global_norm = None
        optimizers = self._optimizers()
        for optimizer in [
            *optimizers,
            *(o for o in self._seen_optimizers if not any(o is r for r in optimizers)),
        ]:
            optimizer._amp_stash.isfinite = None
            optimizer._amp_stash.state = OptState.READY
