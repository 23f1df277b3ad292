"""The key of a captured step (``step_key``): a sha256 over everything the capture read.

It covers the caller's ``Fingerprinter`` (the step's code and every value reachable from it,
see ``fingerprint.py``), the process's inputs (``process_inputs``: ``sys.argv``, the
environment but ``IGNORED_ENVIRONMENT``, the working directory), user code installed in
library modules (``fingerprint.replaced_library_attributes``), the decompositions, the state
layout (each slot's name, shape, dtype, ``requires_grad`` and which slots share a tensor), the
inputs (shape, stride, dtype), the caller's ``selection`` (plain data: what selects a program
in the caller, for cstorch its ``ProgramSignature`` rendered field by field, which holds the
precision policy), torch's global modes and module hooks (an active torch function/dispatch
mode makes a step not cacheable), the caller's ``extra`` string, and the versions
(``versions``: the entry format, torch, jax, jaxlib, Python and this project).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import sys

import jax
import torch

from jax_backend.config import graph_cache as setting
from jax_backend.graph_cache import fingerprint
from jax_backend.state_guard import plain_type

#: The entry format; part of ``versions``, so an entry of another format is another key.
FORMAT = 4  # 4: runtime scalars (3: an optimizer step carries its spec)

#: Environment variables left out of the key: they differ between terminal or SSH sessions
#: and say nothing a step could compute with (and the cache's own location), and those the
#: libraries set themselves during a first trace (``fingerprint.LIBRARY_SET_ENVIRONMENT``).
IGNORED_ENVIRONMENT = frozenset({
    setting.env_var, "_", "OLDPWD", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY",
    "SSH_AUTH_SOCK", "XDG_SESSION_ID", "TERM_SESSION_ID", "WINDOWID", "TMUX_PANE"}) \
    | fingerprint.LIBRARY_SET_ENVIRONMENT


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    """What an entry is valid for: its format and the versions of the libraries and Python."""
    try:
        project = importlib.metadata.version("cstorch-jax")
    except importlib.metadata.PackageNotFoundError:
        project = "unknown"
    return {"format": FORMAT, "torch": torch.__version__, "jax": jax.__version__,
            "jaxlib": importlib.metadata.version("jaxlib"), "python": sys.version,
            "project": project}


def _torch_modes() -> list:
    """torch's global settings a trace can depend on. An active function or dispatch mode
    (``with SomeTorchFunctionMode():`` around the step) rewrites ops in ways we cannot key."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    if _get_current_function_mode_stack() or _get_current_dispatch_mode_stack():
        raise fingerprint.NotCacheable("a torch function or dispatch mode is active")
    return [str(torch.get_default_dtype()), str(torch.get_default_device()),
            torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.are_deterministic_algorithms_enabled(), torch.is_autocast_enabled("cpu"),
            str(torch.get_autocast_dtype("cpu"))]


def process_inputs() -> dict:
    """What a step can read from the process rather than from its objects: the command
    line, the environment (less ``IGNORED_ENVIRONMENT``) and the working directory (what
    relative paths mean)."""
    return {"argv": list(sys.argv),
            "environment": {k: v for k, v in sorted(os.environ.items())
                            if k not in IGNORED_ENVIRONMENT},
            "cwd": os.getcwd()}


def _tensor_signature(t: torch.Tensor) -> list:
    # The plain class: whether DeviceState has guarded a tensor yet must not change the key.
    return [list(t.shape), list(t.stride()), str(t.dtype), t.requires_grad,
            plain_type(t).__name__]


def step_key(fingerprinter: fingerprint.Fingerprinter, slots, inputs, selection,
             decompositions, extra: str) -> str:
    """The cache key of capturing a step over ``slots`` and ``inputs`` (see module docstring);
    ``selection`` is plain data (JSON), the caller's rendering of what selects a program.
    Raises ``fingerprint.NotCacheable`` if some part cannot be fingerprinted."""
    fingerprinter.add("decompositions", {str(op): fn for op, fn in (decompositions or {}).items()})
    fingerprinter.add("torch's global module hooks", fingerprint.torch_global_hooks())
    fingerprinter.add("the process", process_inputs())
    fingerprinter.add("library attributes replaced by user code",
                      fingerprint.replaced_library_attributes())
    index_of, layout = {}, []
    for slot in slots:
        tensor = slot.get()
        unique = index_of.setdefault(id(tensor), len(index_of))
        layout.append([slot.name or repr(slot.key), unique] + _tensor_signature(tensor))
    parts = [versions(), fingerprinter.hexdigest(), layout,
             [_tensor_signature(t) for t in inputs], selection, _torch_modes(), extra]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

