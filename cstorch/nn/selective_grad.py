"""``SelectiveGrad``: train only chosen entries of chosen parameters.

``model.apply(SelectiveGrad(param_filter, init_method))`` computes, for every parameter whose
name matches ``param_filter``, a boolean mask with ``init_method(param)`` and stores it as the
persistent buffer ``<param>_requires_grad`` next to the parameter. From then on, before every
optimizer step the masked-out entries of the gradient and of the optimizer state of the
parameter's shape are zeroed, and the masked-out entries of the parameter are held fixed
through the step, so only the selected entries change. (The masking happens in global
optimizer step hooks rather than gradient hooks, so it is captured in compiled steps.)
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from cstorch.utils.utils import FilterCallable, make_param_filter  # noqa: F401
from jax_backend.errors import CstorchTypeError, CstorchValueError


def outlier(param: torch.Tensor, upper: float = 2.25) -> torch.Tensor:
    """True where ``|param|`` is at least ``upper`` standard deviations (of ``|param|`` along
    dimension 0) — the reference's default mask."""
    magnitude = param.abs()
    return magnitude >= upper * torch.std(magnitude, dim=0, keepdim=True)


_INIT_METHODS = {"outlier": outlier}


def make_init_method(init_method) -> Callable[[torch.Tensor], torch.Tensor]:
    """The mask function for ``init_method`` (a built-in name or a callable(param))."""
    if isinstance(init_method, str):
        if init_method not in _INIT_METHODS:
            raise CstorchValueError(
                f"Unknown `init_method` {init_method!r}; valid options are "
                f"{list(_INIT_METHODS)} or a function param -> bool tensor."
            )
        return _INIT_METHODS[init_method]
    if callable(init_method):
        return init_method
    raise CstorchValueError(
        f"`init_method` must be one of {list(_INIT_METHODS)} or a callable, got {init_method!r}."
    )


class _Selected:
    """A selected parameter: its module, its name and the buffer name of its mask."""

    def __init__(self, module, param_name):
        self.module_ref = weakref.ref(module)
        self.param_name = param_name
        self.mask_name = f"{param_name}_requires_grad"

    @property
    def param(self):
        return self.module_ref()._parameters[self.param_name]

    @property
    def mask(self):
        return self.module_ref()._buffers[self.mask_name]


class SelectiveGrad:
    """Masks the gradients (and updates) of the parameters matching ``param_filter``.

    Args:
        param_filter: glob pattern(s) over parameter names, or ``(name, param) -> bool``.
        init_method: "outlier" or a function ``param -> bool tensor`` (True = trainable).
    """

    def __init__(self, param_filter, init_method="outlier"):
        self._param_filter = make_param_filter(param_filter)
        self._init_method = make_init_method(init_method)
        self._selected = torch.utils.weak.WeakIdKeyDictionary()
        self._hooks = None
        self._held = {}

    def apply(self, obj):
        """Selects the matching parameters of module ``obj`` (and hooks the optimizers)."""
        if not isinstance(obj, torch.nn.Module):
            raise CstorchTypeError(f"Expected a torch.nn.Module, got {type(obj).__name__}.")
        for module_name, module in obj.named_modules():
            for name, param in list(module._parameters.items()):
                full_name = f"{module_name}.{name}" if module_name else name
                if (
                    param is None
                    or param in self._selected
                    or not self._param_filter(full_name, param)
                ):
                    continue
                selected = _Selected(module, name)
                with torch.no_grad():
                    mask = self._init_method(param).to(torch.bool)
                module.register_buffer(selected.mask_name, mask, persistent=True)
                self._selected[param] = selected
        if self._hooks is None:
            self._hooks = (
                register_optimizer_step_pre_hook(self._before_step),
                register_optimizer_step_post_hook(self._after_step),
            )

    def _mine(self, optimizer):
        return [
            self._selected[p]
            for group in optimizer.param_groups
            for p in group["params"]
            if p in self._selected
        ]

    @torch.no_grad()
    def _before_step(self, optimizer, args, kwargs):
        for selected in self._mine(optimizer):
            param, mask = selected.param, selected.mask
            if param.grad is not None:
                param.grad.mul_(mask)
            self._held[id(param)] = torch.where(mask, torch.zeros_like(param), param)
            param.mul_(mask)
            for value in optimizer.state.get(param, {}).values():
                if isinstance(value, torch.Tensor) and value.shape == param.shape:
                    value.mul_(mask)

    @torch.no_grad()
    def _after_step(self, optimizer, args, kwargs):
        for selected in self._mine(optimizer):
            param = selected.param
            held = self._held.pop(id(param), None)
            if held is not None:
                param.mul_(selected.mask).add_(held)
