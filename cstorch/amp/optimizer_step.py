"""``optimizer_step``: scale the loss, backpropagate, unscale, clip, step, update, zero."""

from __future__ import annotations

import torch

from cstorch.amp.grad_scaler import GradScaler
from jax_backend.errors import CstorchTypeError, CstorchValueError


def _is_optimizer(obj) -> bool:
    """Duck-typed: what ``optimizer_step`` uses of an optimizer (``cstorch.optim.Optimizer``
    has it; checking the class would make amp import optim, which imports amp's backend)."""
    return (
        isinstance(getattr(obj, "param_groups", None), list)
        and callable(getattr(obj, "step", None))
        and callable(getattr(obj, "zero_grad", None))
    )


def optimizer_step(
    loss: torch.Tensor,
    optimizer,
    grad_scaler: GradScaler,
    max_gradient_norm: float = None,
    max_gradient_value: float = None,
):
    """The cstorch mixed-precision training step in one call.

    Differs from cerebras-pytorch 2.10 in two fixes: a non-Optimizer item in a list of
    optimizers raises the intended TypeError (the reference hits a NameError building its
    message), and with a list of optimizers clipping covers all their parameters (the
    reference reads ``param_groups`` of the list itself)."""
    if not isinstance(loss, torch.Tensor):
        raise CstorchValueError(f"Expected the loss to be a single tensor. Got: {type(loss)}")
    if _is_optimizer(optimizer):
        optimizers = [optimizer]
    elif isinstance(optimizer, (list, tuple)):
        optimizers = list(optimizer)
        for i, item in enumerate(optimizers):
            if not _is_optimizer(item):
                raise CstorchTypeError(
                    f"Expected optimizer {i} to be a `cstorch.optim.Optimizer`. Got: `{type(item)}`"
                )
    else:
        raise CstorchTypeError(
            f"Expected optimizer to be a `cstorch.optim.Optimizer` or a list of "
            f"them. Got: `{type(optimizer)}`"
        )
    if not isinstance(grad_scaler, GradScaler):
        raise CstorchTypeError(
            f"Expected grad_scaler to be a `cstorch.amp.GradScaler`. Got: `{type(grad_scaler)}`"
        )
    if max_gradient_norm is not None and max_gradient_norm < 0.0:
        raise CstorchValueError(
            f"max_gradient_norm has to be a non-negative float. Got {max_gradient_norm}"
        )
    if max_gradient_value is not None and max_gradient_value < 0.0:
        raise CstorchValueError(
            f"max_gradient_value has to be a non-negative float. Got {max_gradient_value}"
        )
    if max_gradient_norm is not None and max_gradient_value is not None:
        raise CstorchValueError(
            f"Gradients can be clipped by norm(={max_gradient_norm}) or by "
            f"value(={max_gradient_value}), but not both. Do not set both "
            "`max_gradient_norm` and `max_gradient_value`."
        )

    grad_scaler.scale(loss).backward()
    for item in optimizers:
        grad_scaler.unscale_(item)
    params = [p for item in optimizers for group in item.param_groups for p in group["params"]]
    if max_gradient_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_gradient_norm)
    elif max_gradient_value is not None:
        torch.nn.utils.clip_grad_value_(params, max_gradient_value)
    for item in optimizers:
        grad_scaler.step(item)
    grad_scaler.update()
    for item in optimizers:
        item.zero_grad()
