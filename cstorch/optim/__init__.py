"""cstorch optimizers and schedulers."""

from cstorch.optim import lr_scheduler, scheduler, weight_decay_scheduler
from cstorch.optim.adam import Adam, AdamW
from cstorch.optim.optimizer import Optimizer
from cstorch.optim.sgd import SGD

__all__ = [
    "Adam", "AdamW", "Optimizer", "SGD", "lr_scheduler", "scheduler", "weight_decay_scheduler",
]
