"""Learning-rate schedulers: the generic schedulers of ``cstorch.optim.scheduler`` writing
``group["lr"]``, with LR-specific argument names. Those are also the names their attributes,
and so their ``state_dict`` keys, use (``learning_rate``, ``initial_learning_rate``,
``base_lr``, ...), for checkpoint compatibility with cerebras-pytorch. Each class's maths and
differences from cerebras-pytorch are described on its generic base.
"""

from typing import List, Optional

import torch

from cstorch.optim import scheduler as _s
from cstorch.optim.scheduler import Tags, _alias, inherit_docs


class LRScheduler(_s.Scheduler, torch.optim.lr_scheduler._LRScheduler):
    """Base of LR schedulers (``param_group_key = "lr"``). torch's ``LRScheduler.__init__``
    is deliberately not run: only the isinstance relation and the method names are kept."""

    @property
    def param_group_key(self):
        return "lr"

    def get_last_lr(self):
        """The current learning rate of each targeted group (None for the others)."""
        return self.get_last_value()

    def get_lr(self):
        return self.get()


class ConstantLR(LRScheduler, _s.ConstantScheduler):
    val = _alias("learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        learning_rate: float,
        total_iters: Optional[int] = None,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer, val=learning_rate, total_iters=total_iters, param_group_tags=param_group_tags
        )


class PolynomialLR(LRScheduler, _s.PolynomialScheduler):
    initial_val = _alias("initial_learning_rate")
    end_val = _alias("end_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        end_learning_rate: float,
        total_iters: int,
        power: float = 1.0,
        cycle: bool = False,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            end_val=end_learning_rate,
            total_iters=total_iters,
            power=power,
            cycle=cycle,
            param_group_tags=param_group_tags,
        )


class LinearLR(LRScheduler, _s.LinearScheduler):
    initial_val = _alias("initial_learning_rate")
    end_val = _alias("end_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        end_learning_rate: float,
        total_iters: int,
        cycle: bool = False,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            end_val=end_learning_rate,
            total_iters=total_iters,
            cycle=cycle,
            param_group_tags=param_group_tags,
        )


class ExponentialLR(LRScheduler, _s.ExponentialScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        total_iters: int,
        decay_rate: float,
        staircase: bool = False,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            total_iters=total_iters,
            decay_rate=decay_rate,
            staircase=staircase,
            param_group_tags=param_group_tags,
        )


class InverseExponentialTimeDecayLR(LRScheduler, _s.InverseExponentialTimeDecayScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        step_exponent: int,
        total_iters: int,
        decay_rate: float,
        staircase: bool = False,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            step_exponent=step_exponent,
            total_iters=total_iters,
            decay_rate=decay_rate,
            staircase=staircase,
            param_group_tags=param_group_tags,
        )


class InverseSquareRootDecayLR(LRScheduler, _s.InverseSquareRootDecayScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float = 1.0,
        scale: float = 1.0,
        warmup_steps: int = 1.0,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            scale=scale,
            warmup_steps=warmup_steps,
            param_group_tags=param_group_tags,
        )


class CosineDecayLR(LRScheduler, _s.CosineDecayScheduler):
    initial_val = _alias("initial_learning_rate")
    end_val = _alias("end_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        end_learning_rate: float,
        total_iters: int,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            end_val=end_learning_rate,
            total_iters=total_iters,
            param_group_tags=param_group_tags,
        )


class SequentialLR(LRScheduler, _s.SequentialScheduler):
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        schedulers: List[LRScheduler],
        milestones: List[int],
        last_epoch: int = -1,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            schedulers=schedulers,
            milestones=milestones,
            last_epoch=last_epoch,
            param_group_tags=param_group_tags,
        )


class PiecewiseConstantLR(LRScheduler, _s.PiecewiseConstantScheduler):
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        learning_rates: List[float],
        milestones: List[int],
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            ConstantLR,
            vals=learning_rates,
            milestones=milestones,
            param_group_tags=param_group_tags,
        )


class MultiStepLR(LRScheduler, _s.MultiStepScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        gamma: float,
        milestones: List[int],
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            gamma=gamma,
            milestones=milestones,
            param_group_tags=param_group_tags,
        )


class StepLR(LRScheduler, _s.StepScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        step_size: int,
        gamma: float,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            step_size=step_size,
            gamma=gamma,
            param_group_tags=param_group_tags,
        )


class CosineAnnealingLR(LRScheduler, _s.CosineAnnealingScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        T_max: int,
        eta_min: float = 0.0,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            T_max=T_max,
            eta_min=eta_min,
            param_group_tags=param_group_tags,
        )


class LambdaLR(LRScheduler, _s.LambdaScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer, initial_val=initial_learning_rate, param_group_tags=param_group_tags
        )


class CosineAnnealingWarmRestarts(LRScheduler, _s.CosineAnnealingWarmRestartsScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        T_0: int,
        T_mult: int = 1,
        eta_min: float = 0.0,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            T_0=T_0,
            T_mult=T_mult,
            eta_min=eta_min,
            param_group_tags=param_group_tags,
        )


class MultiplicativeLR(LRScheduler, _s.MultiplicativeScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        coefficient: float,
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            coefficient=coefficient,
            param_group_tags=param_group_tags,
        )


class ChainedLR(LRScheduler, _s.ChainedScheduler):
    def __init__(self, schedulers: List[LRScheduler], param_group_tags: Tags = None):
        super().__init__(schedulers=schedulers, param_group_tags=param_group_tags)


class ChainedScheduler(ChainedLR):
    """``ChainedLR`` under torch's name."""


class CyclicLR(LRScheduler, _s.CyclicScheduler):
    base_val = _alias("base_lr")
    max_val = _alias("max_lr")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        base_lr: float,
        max_lr: float,
        step_size_up: int = 2000,
        step_size_down: Optional[int] = None,
        mode: str = "triangular",
        gamma: float = 1.0,
        scale_mode: str = "cycle",
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            base_val=base_lr,
            max_val=max_lr,
            step_size_up=step_size_up,
            step_size_down=step_size_down,
            mode=mode,
            gamma=gamma,
            scale_mode=scale_mode,
            param_group_tags=param_group_tags,
        )


class OneCycleLR(LRScheduler, _s.OneCycleScheduler):
    initial_val = _alias("initial_learning_rate")
    max_val = _alias("max_lr")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_learning_rate: float,
        max_lr: float,
        total_steps: int = 1000,
        pct_start: float = 0.3,
        final_div_factor: float = 10000.0,
        three_phase: bool = False,
        anneal_strategy: str = "cos",
        param_group_tags: Tags = None,
    ):
        super().__init__(
            optimizer,
            initial_val=initial_learning_rate,
            max_val=max_lr,
            total_steps=total_steps,
            pct_start=pct_start,
            final_div_factor=final_div_factor,
            three_phase=three_phase,
            anneal_strategy=anneal_strategy,
            param_group_tags=param_group_tags,
        )


class ScalePerParamLR(LRScheduler, _s.ScalePerParamScheduler):
    adjustment_scalars = _alias("lr_adjustment_scalars")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: LRScheduler,
        param_group_tags: Tags = None,
    ):
        super().__init__(optimizer, scheduler=scheduler, param_group_tags=param_group_tags)


inherit_docs(globals(), LRScheduler)

__all__ = [
    "LRScheduler",
    "ConstantLR",
    "PolynomialLR",
    "LinearLR",
    "ExponentialLR",
    "InverseExponentialTimeDecayLR",
    "InverseSquareRootDecayLR",
    "CosineDecayLR",
    "SequentialLR",
    "PiecewiseConstantLR",
    "MultiStepLR",
    "StepLR",
    "CosineAnnealingLR",
    "LambdaLR",
    "CosineAnnealingWarmRestarts",
    "MultiplicativeLR",
    "ChainedLR",
    "ChainedScheduler",
    "CyclicLR",
    "OneCycleLR",
    "ScalePerParamLR",
]
