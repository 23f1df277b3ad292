"""1.8/1.9 ``cstorch.utils``: ``data`` (the 1.8 DataLoader, 1.9 DataExecutor),
``tensorboard`` and ``CSConfig``."""

import cstorch.utils.tensorboard as tensorboard  # noqa: F401 - a from-import warns
from cstorch.utils import *  # noqa: F403
from cstorch.utils._cs_config import CSConfig as CSConfig

from . import data as data
