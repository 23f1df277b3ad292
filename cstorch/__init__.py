"""cstorch: the Cerebras PyTorch API on a JAX static graph.

``import cerebras.pytorch as cstorch`` gives this package (see ``compat/``).

Importing it changes nothing outside it (JAX's config, the environment, torch, the import
system); settings are in ``cstorch.config``.
"""

import os as _os

import jax_backend as _jax_backend
from cstorch import config

# True only while documentation is generated from the docstrings (as in the reference).
_generating_docs = config.generating_docs.value

_jax_backend.register_internal_dir(_os.path.dirname(__file__))
_jax_backend.graph_cache.fingerprint.register_project_dir(_os.path.dirname(__file__))

from cstorch import (  # noqa: E402
    amp,
    core as core,
    distributed as distributed,
    experimental,
    mesh,
    metrics,
    nn,
    optim,
    profiler as profiler,
    saver as saver,
    sparse as sparse,
    utils,
)
from cstorch._cirh import cirh as cirh  # noqa: E402
from cstorch.backend import (  # noqa: E402
    backend,
    current_backend,
    current_backend_impl as current_backend_impl,
    current_torch_device,
    use_cs,
)
from cstorch.backends import backends  # noqa: E402
from cstorch.core.compile import compile, trace  # noqa: E402
from cstorch.core.device import device as device  # noqa: E402
from cstorch.core.name_scope import (  # noqa: E402
    add_debug_name as add_debug_name,
    get_debug_name as get_debug_name,
    name_scope as name_scope,
    set_debug_scope as set_debug_scope,
)
from cstorch.core.tensor import tensor as tensor  # noqa: E402
from cstorch.decomp.registry import register_decomposition  # noqa: E402
from cstorch.jax_export import export as export, torch_state_dict as torch_state_dict  # noqa: E402
from cstorch.lib import cerebras_pytorch_lib as cerebras_pytorch_lib  # noqa: E402
from cstorch.storage import load, save  # noqa: E402
from cstorch.utils._removed import __getattr__ as __getattr__  # noqa: E402
from cstorch.utils.constant import make_constant as make_constant  # noqa: E402
from cstorch.utils.data.data_executor import current_executor  # noqa: E402
from cstorch.utils.data.utils import from_numpy, to_numpy  # noqa: E402
from cstorch.utils.device_annotation import device_annotation as device_annotation  # noqa: E402
from cstorch.utils.pol import current_pol as current_pol, pol as pol  # noqa: E402
from cstorch.utils.step_closures import checkpoint_closure, step_closure  # noqa: E402
from cstorch.utils.tensor import full, full_like, ones, ones_like, zeros, zeros_like  # noqa: E402

__version__ = "2.10.0"

__all__ = [
    "amp",
    "backend",
    "backends",
    "checkpoint_closure",
    "compile",
    "current_backend",
    "current_executor",
    "current_torch_device",
    "experimental",
    "from_numpy",
    "full",
    "full_like",
    "load",
    "mesh",
    "metrics",
    "nn",
    "ones",
    "ones_like",
    "optim",
    "register_decomposition",
    "save",
    "step_closure",
    "to_numpy",
    "trace",
    "use_cs",
    "utils",
    "zeros",
    "zeros_like",
]
