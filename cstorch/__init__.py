"""cstorch: the Cerebras PyTorch API on a JAX static graph.

``import cerebras.pytorch as cstorch`` gives this package (see ``compat/``).
"""

from cstorch import amp, backend as _backend_module, core, optim, utils  # noqa: F401
from cstorch.backend import (
    backend,
    current_backend,
    current_backend_impl,
    current_torch_device,
    use_cs,
)
from cstorch.core.compile import compile, trace  # noqa: A004
from cstorch.core.device import device
from cstorch.utils.data.data_executor import current_executor
from cstorch.utils.step_closures import checkpoint_closure, step_closure

__version__ = "2.10.0"

__all__ = [
    "amp", "backend", "checkpoint_closure", "compile", "current_backend", "current_executor",
    "current_torch_device", "optim", "step_closure", "trace", "use_cs", "utils",
]
