"""Weight-decay schedulers: the generic schedulers of ``cstorch.optim.scheduler`` writing
``group["weight_decay"]``. They take the generic argument names (``val``, ``initial_val``,
``end_val``, ``base_val``, ``max_val``); ``PiecewiseConstantWD`` takes ``vals``. Each class's
maths and differences from cerebras-pytorch are described on its generic base.
"""

from typing import List

import torch

from cstorch.optim import scheduler as _s
from cstorch.optim.scheduler import Tags, inherit_docs


class WeightDecayScheduler(_s.Scheduler):
    """Base of weight-decay schedulers (``param_group_key = "weight_decay"``)."""

    @property
    def param_group_key(self):
        return "weight_decay"


class ConstantWD(WeightDecayScheduler, _s.ConstantScheduler):
    pass


class PolynomialWD(WeightDecayScheduler, _s.PolynomialScheduler):
    pass


class LinearWD(WeightDecayScheduler, _s.LinearScheduler):
    pass


class ExponentialWD(WeightDecayScheduler, _s.ExponentialScheduler):
    pass


class InverseExponentialTimeDecayWD(WeightDecayScheduler, _s.InverseExponentialTimeDecayScheduler):
    pass


class InverseSquareRootDecayWD(WeightDecayScheduler, _s.InverseSquareRootDecayScheduler):
    pass


class CosineDecayWD(WeightDecayScheduler, _s.CosineDecayScheduler):
    pass


class SequentialWD(WeightDecayScheduler, _s.SequentialScheduler):
    pass


class PiecewiseConstantWD(WeightDecayScheduler, _s.PiecewiseConstantScheduler):
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        vals: List[float],
        milestones: List[int],
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            ConstantWD,
            vals=vals,
            milestones=milestones,
            param_group_tags=param_group_tags,
        )


class MultiStepWD(WeightDecayScheduler, _s.MultiStepScheduler):
    pass


class StepWD(WeightDecayScheduler, _s.StepScheduler):
    pass


class CosineAnnealingWD(WeightDecayScheduler, _s.CosineAnnealingScheduler):
    pass


class LambdaWD(WeightDecayScheduler, _s.LambdaScheduler):
    pass


class CosineAnnealingWarmRestartsWD(WeightDecayScheduler, _s.CosineAnnealingWarmRestartsScheduler):
    pass


class MultiplicativeWD(WeightDecayScheduler, _s.MultiplicativeScheduler):
    pass


class ChainedWD(WeightDecayScheduler, _s.ChainedScheduler):
    pass


class CyclicWD(WeightDecayScheduler, _s.CyclicScheduler):
    pass


class OneCycleWD(WeightDecayScheduler, _s.OneCycleScheduler):
    pass


class ScalePerParamWD(WeightDecayScheduler, _s.ScalePerParamScheduler):
    pass


inherit_docs(globals(), WeightDecayScheduler)

__all__ = [
    "WeightDecayScheduler",
    "ConstantWD",
    "PolynomialWD",
    "LinearWD",
    "ExponentialWD",
    "InverseExponentialTimeDecayWD",
    "InverseSquareRootDecayWD",
    "CosineDecayWD",
    "SequentialWD",
    "PiecewiseConstantWD",
    "MultiStepWD",
    "StepWD",
    "CosineAnnealingWD",
    "LambdaWD",
    "CosineAnnealingWarmRestartsWD",
    "MultiplicativeWD",
    "ChainedWD",
    "CyclicWD",
    "OneCycleWD",
    "ScalePerParamWD",
]
