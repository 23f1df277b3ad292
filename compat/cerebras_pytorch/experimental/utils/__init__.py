"""1.8/1.9 ``cstorch.utils``: ``data`` (the 1.8 DataLoader, 1.9 DataExecutor),
``tensorboard`` and ``CSConfig``."""

from cstorch.utils import tensorboard as tensorboard
from cstorch.utils import *  # noqa: F403
from cstorch.utils._cs_config import CSConfig as CSConfig

from . import data as data
