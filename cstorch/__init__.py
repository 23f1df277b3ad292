"""cstorch: the Cerebras PyTorch API on a JAX static graph.

``import cerebras.pytorch as cstorch`` gives this package (see ``compat/``).
"""

import os as _os

import jax_backend as _jax_backend

_jax_backend.register_internal_dir(_os.path.dirname(__file__))

from cstorch import amp, backend as _backend_module, core, optim, utils  # noqa: E402,F401
from cstorch.backend import (  # noqa: E402
    backend,
    current_backend,
    current_backend_impl,
    current_torch_device,
    use_cs,
)
from cstorch.core.compile import compile, trace  # noqa: A004,E402
from cstorch.core.device import device  # noqa: E402
from cstorch.storage import load, save  # noqa: E402
from cstorch.utils.data.data_executor import current_executor  # noqa: E402
from cstorch.utils.step_closures import checkpoint_closure, step_closure  # noqa: E402

__version__ = "2.10.0"

__all__ = [
    "amp", "backend", "checkpoint_closure", "compile", "current_backend", "current_executor",
    "current_torch_device", "load", "optim", "save", "step_closure", "trace", "use_cs", "utils",
]
