"""Learning-rate schedulers: the generic schedulers of ``cstorch.optim.scheduler`` writing
``group["lr"]``, with the LR-specific argument names (which are also the names their
``state_dict`` uses, for checkpoint compatibility with cerebras-pytorch)."""

from __future__ import annotations

import torch

from cstorch.optim import scheduler as _s
from cstorch.optim.scheduler import Tags, _alias


class LRScheduler(_s.Scheduler, torch.optim.lr_scheduler.LRScheduler):
    """Base of LR schedulers (torch's LRScheduler ``__init__`` is deliberately not run)."""

    @property
    def param_group_key(self):
        return "lr"

    def get_last_lr(self):
        return self.get_last_value()

    def get_lr(self):
        return self.get()


class ConstantLR(LRScheduler, _s.ConstantScheduler):
    val = _alias("learning_rate")

    def __init__(self, optimizer, learning_rate, total_iters=None, param_group_tags: Tags = None):
        super().__init__(optimizer, val=learning_rate, total_iters=total_iters,
                         param_group_tags=param_group_tags)


class PolynomialLR(LRScheduler, _s.PolynomialScheduler):
    initial_val = _alias("initial_learning_rate")
    end_val = _alias("end_learning_rate")

    def __init__(self, optimizer, initial_learning_rate, end_learning_rate, total_iters,
                 power=1.0, cycle=False, param_group_tags: Tags = None):
        super().__init__(optimizer, initial_val=initial_learning_rate,
                         end_val=end_learning_rate, total_iters=total_iters, power=power,
                         cycle=cycle, param_group_tags=param_group_tags)


class LinearLR(LRScheduler, _s.LinearScheduler):
    initial_val = _alias("initial_learning_rate")
    end_val = _alias("end_learning_rate")

    def __init__(self, optimizer, initial_learning_rate, end_learning_rate, total_iters,
                 cycle=False, param_group_tags: Tags = None):
        super().__init__(optimizer, initial_val=initial_learning_rate,
                         end_val=end_learning_rate, total_iters=total_iters, cycle=cycle,
                         param_group_tags=param_group_tags)


class CosineDecayLR(LRScheduler, _s.CosineDecayScheduler):
    initial_val = _alias("initial_learning_rate")
    end_val = _alias("end_learning_rate")

    def __init__(self, optimizer, initial_learning_rate, end_learning_rate, total_iters,
                 param_group_tags: Tags = None):
        super().__init__(optimizer, initial_val=initial_learning_rate,
                         end_val=end_learning_rate, total_iters=total_iters,
                         param_group_tags=param_group_tags)


class SequentialLR(LRScheduler, _s.SequentialScheduler):
    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1,
                 param_group_tags: Tags = None):
        super().__init__(optimizer, schedulers=schedulers, milestones=milestones,
                         last_epoch=last_epoch, param_group_tags=param_group_tags)
