"""Weight-decay schedulers: the generic schedulers writing ``group["weight_decay"]``."""

from __future__ import annotations

from cstorch.optim import scheduler as _s


class WeightDecayScheduler(_s.Scheduler):
    @property
    def param_group_key(self):
        return "weight_decay"


class ConstantWD(WeightDecayScheduler, _s.ConstantScheduler):
    pass


class PolynomialWD(WeightDecayScheduler, _s.PolynomialScheduler):
    pass


class LinearWD(WeightDecayScheduler, _s.LinearScheduler):
    pass


class CosineDecayWD(WeightDecayScheduler, _s.CosineDecayScheduler):
    pass


class SequentialWD(WeightDecayScheduler, _s.SequentialScheduler):
    pass
