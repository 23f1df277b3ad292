"""Losses cerebras-pytorch implements itself (written in plain torch ops)."""

from __future__ import annotations

import math

import torch

from cstorch.nn import functional as F
from cstorch.nn.losses import accepts_use_autogen
from jax_backend.errors import CstorchValueError


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


class HuberLoss(torch.nn.Module):
    """½z² where z=|input−target| < delta, else delta·(z − ½delta)."""

    @accepts_use_autogen
    def __init__(self, reduction="mean", delta=1.0):
        super().__init__()
        assert delta > 0, "HuberLoss only supports positive values for delta."
        self.reduction = reduction
        self.delta = delta

    def forward(self, input, target):
        z = (input - target).abs()
        loss = torch.where(z < self.delta, 0.5 * z * z, self.delta * (z - 0.5 * self.delta))
        return _reduce(loss, self.reduction)


class SmoothL1Loss(torch.nn.Module):
    """½z²/beta where z=|input−target| < beta, else z − ½beta."""

    @accepts_use_autogen
    def __init__(self, reduction="mean", beta=1.0):
        super().__init__()
        assert beta >= 0, "SmoothL1Loss only supports non-negative values for beta."
        self.reduction = reduction
        self.beta = beta

    def forward(self, input, target):
        z = (input - target).abs()
        if self.beta == 0:
            return _reduce(z, self.reduction)
        loss = torch.where(z < self.beta, 0.5 * z * z / self.beta, z - 0.5 * self.beta)
        return _reduce(loss, self.reduction)


class GaussianNLLLoss(torch.nn.Module):
    """½(log var + (input−target)²/var) (+ ½log 2π if ``full``), var clamped to ``eps``."""

    @accepts_use_autogen
    def __init__(self, full=False, eps=1e-6, reduction="mean"):
        super().__init__()
        self.full = full
        self.eps = eps
        self.reduction = reduction

    def forward(self, input, target, var):
        if var.shape != input.shape:
            if input.shape[:-1] == var.shape:
                var = var.unsqueeze(-1)
            elif not (input.shape[:-1] == var.shape[:-1] and var.shape[-1] == 1):
                raise CstorchValueError(f"`var` is of incorrect size: {tuple(var.shape)}.")
        # Clamped in value only: the gradient flows as if unclamped (as the reference's
        # in-place clamp under no_grad, and torch's GaussianNLLLoss).
        var = var + (torch.clamp(var, min=self.eps) - var).detach()
        loss = 0.5 * (torch.log(var) + (input - target) ** 2 / var)
        if self.full:
            loss = loss + 0.5 * math.log(2 * math.pi)
        return _reduce(loss, self.reduction)


class MultiMarginLoss(torch.nn.Module):
    """Multi-class hinge loss Σ_{i≠y} max(0, margin − x[y] + x[i])^p / C (p ∈ {1, 2}); the
    "none" reduction is not supported."""

    @accepts_use_autogen
    def __init__(self, p=1, margin=1.0, weight=None, reduction="mean"):
        super().__init__()
        assert p in (1, 2), "MultiMarginLoss only supports p being 1 or 2."
        assert reduction != "none", "MultiMarginLoss does not support 'none' reduction."
        self.p = p
        self.margin = margin
        self.weight = weight
        self.reduction = reduction

    def forward(self, x, y):
        target_scores = torch.gather(x, -1, y.unsqueeze(-1).to(torch.int64))
        loss = (self.margin - target_scores + x).clamp(min=0)
        if self.p == 2:
            loss = loss * loss
        # The i == y terms each contribute margin**p; remove them.
        loss = (
            loss
            - torch.nn.functional.one_hot(y.to(torch.int64), x.shape[-1]).to(loss.dtype)
            * self.margin**self.p
        )
        if self.weight is not None:
            loss = loss * torch.gather(self.weight, 0, y.to(torch.int64)).unsqueeze(-1)
        per_sample = loss.sum(-1) / x.shape[-1]
        return _reduce(per_sample, self.reduction)


class DiceLoss:
    """Per-sample, per-class Dice score 2·|P∩T| / (|P|+|T|) of softmax (or argmax)
    predictions against one-hot targets; channel 0 (background) is zeroed unless
    ``include_background``. ``__call__`` returns the (N, C) scores (not 1 − score), as the
    reference does.
    """

    def __init__(
        self,
        num_classes: int,
        to_onehot_y: bool = True,
        to_onehot_x: bool = False,
        use_softmax: bool = True,
        use_argmax: bool = False,
        include_background: bool = False,
    ):
        self.num_classes = num_classes
        self.to_onehot_y = to_onehot_y
        self.to_onehot_x = to_onehot_x
        self.use_softmax = use_softmax
        self.use_argmax = use_argmax
        self.include_background = include_background
        self.smooth_nr = 0.0
        self.smooth_dr = 1e-6

    def __call__(self, prediction, target, input_shape=None):
        channel = 1
        target = target.unsqueeze(channel)
        reduce_dims = list(range(2, prediction.dim()))
        num_channels = prediction.shape[channel]
        if self.use_softmax:
            prediction = torch.softmax(prediction, dim=channel)
        elif self.use_argmax:
            prediction = torch.argmax(prediction, dim=channel)
        if self.to_onehot_y:
            target = _to_one_hot(target, channel, self.num_classes)
        if self.to_onehot_x:
            prediction = _to_one_hot(prediction, channel, self.num_classes)
        if not self.include_background:
            assert num_channels > 1, (
                "To exclude the background the prediction needs more than "
                f"one channel, got {num_channels}."
            )
            mask = torch.ones(prediction.shape[channel], dtype=prediction.dtype)
            mask[0] = 0
            mask = mask.view([1, -1] + [1] * (prediction.dim() - 2))
            target, prediction = target * mask, prediction * mask
        assert target.shape == prediction.shape, (
            f"Target and prediction shapes do not match: {tuple(target.shape)} and "
            f"{tuple(prediction.shape)}."
        )
        intersection = torch.sum(target * prediction, dim=reduce_dims)
        denominator = torch.sum(target, dim=reduce_dims) + torch.sum(prediction, dim=reduce_dims)
        return (2.0 * intersection + self.smooth_nr) / (denominator + self.smooth_dr)


def _to_one_hot(array, channel, num_classes):
    """Class ids with a size-1 channel axis → one-hot along that axis (float)."""
    if array.dim() > channel and array.shape[channel] == 1:
        array = array.squeeze(channel)
    return F.one_hot(array.long(), num_classes).float().movedim(-1, channel)


class DiceCELoss(torch.nn.Module):
    """wc·CrossEntropy + wd·(1 − mean Dice), the Dice mean corrected for the excluded
    background class."""

    @accepts_use_autogen
    def __init__(self, num_classes, include_background, wc=0.5, wd=0.5):
        super().__init__()
        self.dice = DiceLoss(num_classes=num_classes, include_background=include_background)
        self.cross_entropy = torch.nn.CrossEntropyLoss()
        self.wc = wc
        self.wd = wd
        self.mean_correction = 1.0 if include_background else num_classes / (num_classes - 1)

    def forward(self, outputs, labels, input_shape=None):
        ce = self.cross_entropy(outputs, labels)
        dice = self.mean_correction * torch.mean(self.dice(outputs, labels, input_shape))
        return self.wc * ce + self.wd * (1.0 - dice)
