"""``cbtorch.optimizer(opt)`` and the 1.x ``cbtorch.optim.lr_scheduler`` classes.

``LazyOptimizer`` is the 1.x wrapper around the Model Zoo's own torch optimizer: an instance
of ``cbtorch.optim.Optimizer`` (the zoo checks), whose parameters, state and methods are the
wrapped optimizer's (``_optimizer``), registered with the backend so its state (momentum
buffers, ...) is carried between compiled steps.

The 1.x learning-rate classes (``Constant``, ``Polynomial``, ...) described a schedule the
Cerebras stack computed on the device from the step; the zoo's own scheduler leaves the
host's learning rate alone there. The classes here only record their arguments
(``cbtorch.optim`` offers them during a 1.x appliance run, ``optim_view``): the appliance
feeds the compiled step each step's learning rate from the zoo's own schedule function
(``appliance._LearningRates``).
"""

from __future__ import annotations

import types

import torch

import cstorch
from cstorch.optim import Optimizer as _CstorchOptimizer


class LazyOptimizer(_CstorchOptimizer):
    def __init__(self, optimizer: torch.optim.Optimizer):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"cbtorch.optimizer expects a torch.optim.Optimizer, got "
                f"{type(optimizer).__name__}."
            )
        self.__dict__["_optimizer"] = optimizer
        self.backend = cstorch.backend()._impl
        self._schedulers_registry = {}
        self.main_lr_scheduler = None
        self.backend.register_optimizer(optimizer)

    # The wrapped optimizer's parameters and state are this optimizer's.
    param_groups = property(lambda self: self._optimizer.param_groups)
    state = property(lambda self: self._optimizer.state)
    defaults = property(lambda self: self._optimizer.defaults)

    def preinitialize(self):
        """The wrapped optimizer created its state when it was built."""

    def step(self, closure=None):
        return self._optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True):
        self.backend.gradients_reset(  # the step zeroes its gradients (see cstorch.trace)
            [p for group in self.param_groups for p in group["params"]], set_to_none
        )
        return self._optimizer.zero_grad(set_to_none)

    def state_dict(self, *args, **kwargs):
        self.backend.materialize_state()
        return self._optimizer.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict):
        self._optimizer.load_state_dict(state_dict)
        self.backend.invalidate_state_view()

    def set_main_lr_scheduler(self, lr_scheduler) -> None:
        self.main_lr_scheduler = lr_scheduler

    def convert_state_dict_for_checkpoint(self, state_dict):
        """1.x renamed device state for checkpoints; the state here is the torch state."""
        return state_dict

    def __getattr__(self, name):
        if name == "_optimizer":
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __repr__(self):
        return f"LazyOptimizer({self._optimizer!r})"


class _Schedule1x:
    """A 1.x device learning-rate schedule: its arguments, recorded (see the module doc)."""

    def __init__(self, optimizer, *args, **kwargs):
        self.optimizer = optimizer
        self.args = args
        self.kwargs = kwargs


# Every cbtorch.optim.lr_scheduler name the 1.6-1.9 zoo builds on a Cerebras system.
V1_SCHEDULERS = {
    name: type(name, (_Schedule1x,), {"__doc__": f"1.x ``{name}`` (recorded)."})
    for name in (
        "Constant",
        "Polynomial",
        "Step",
        "MultiStep",
        "Lambda",
        "Exponential",
        "InverseExponentialTimeDecay",
        "InverseSquareRootDecay",
        "CosineDecay",
        "CosineAnnealing",
        "CosineAnnealingWarmRestarts",
        "Multiplicative",
        "OneCycleLR",
        "CyclicLR",
        "ScalePerParamLR",
    )
}


class _View(types.ModuleType):
    """A module reading as ``base`` except for the names in ``overrides``."""

    def __init__(self, name, base, overrides):
        super().__init__(name, base.__doc__)
        self.__dict__.update(overrides)
        self._base = base

    def __getattr__(self, name):
        return getattr(self.__dict__["_base"], name)


_optim_view = None


def optim_view():
    """``cbtorch.optim`` during a 1.x appliance run: cstorch.optim (its ``Optimizer``, the
    ``isinstance`` the zoo checks), with ``lr_scheduler`` offering the 1.x schedule classes
    under the names they had (several of which cstorch has as different 2.x classes)."""
    global _optim_view
    if _optim_view is None:
        import cstorch.optim.lr_scheduler as lr_2x

        lr_view = _View("cerebras_pytorch.optim.lr_scheduler", lr_2x, V1_SCHEDULERS)
        _optim_view = _View("cerebras_pytorch.optim", cstorch.optim, {"lr_scheduler": lr_view})
    return _optim_view
