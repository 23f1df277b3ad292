"""cstorch optimizers and schedulers.

``__all__`` lists what cerebras-pytorch 2.10 exports. The configuration helpers of the 1.x API
(``configure_optimizer``, ``configure_lr_scheduler``, ``configure_scheduler``, ``configure_param_groups``,
``configure_optimizer_params``, ``configure_scheduler_params``; ``cstorch.optim.config``) are
importable from here too, for older scripts.
"""

from cstorch.optim import lr_scheduler, scheduler, weight_decay_scheduler
from cstorch.optim.adadelta import Adadelta
from cstorch.optim.adafactor import Adafactor
from cstorch.optim.adagrad import Adagrad
from cstorch.optim.adam import Adam, AdamW
from cstorch.optim.adamax import Adamax
from cstorch.optim.asgd import ASGD
from cstorch.optim.config import (
    configure_lr_scheduler as configure_lr_scheduler,
    configure_optimizer as configure_optimizer,
    configure_optimizer_params as configure_optimizer_params,
    configure_scheduler as configure_scheduler,
    configure_scheduler_params as configure_scheduler_params,
)
from cstorch.optim.lamb import Lamb
from cstorch.optim.lion import Lion
from cstorch.optim.muon import Muon
from cstorch.optim.nadam import NAdam
from cstorch.optim.optax import OptaxOptimizer as OptaxOptimizer, from_optax as from_optax
from cstorch.optim.optimizer import Optimizer
from cstorch.optim.param_groups import configure_param_groups as configure_param_groups
from cstorch.optim.radam import RAdam
from cstorch.optim.rmsprop import RMSprop
from cstorch.optim.rprop import Rprop
from cstorch.optim.sgd import SGD

__all__ = [
    "Optimizer",
    "Adadelta",
    "Adafactor",
    "Adagrad",
    "Adamax",
    "Adam",
    "AdamW",
    "ASGD",
    "Lamb",
    "Lion",
    "Muon",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "SGD",
    "scheduler",
    "lr_scheduler",
    "weight_decay_scheduler",
]
