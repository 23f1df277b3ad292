"""1.8/1.9 ``cstorch.utils``: ``data`` (the 1.8 DataLoader, 1.9 DataExecutor),
``tensorboard`` and ``CSConfig``."""

import cstorch.utils.tensorboard as tensorboard  # noqa: F401
from cstorch.utils import *  # noqa: F401,F403
from cstorch.utils._cs_config import CSConfig  # noqa: F401

from . import data  # noqa: E402,F401
