"""The key of a captured step (``step_key``): a list of named parts, each the sha256 of one
thing the capture read, and the entry's name the sha256 over them (``StepKey``), as JAX's
``cache_key.get()`` names each part of its own key. A miss can then say which parts differ
from the step's stored entries (``explain.py``).

The parts, in this order:

* ``version of <format, torch, jax, jaxlib, python, project>`` (``versions``);
* the caller's fingerprint parts (the step's code and every value reachable from it, see
  ``fingerprint.py``), then the engine's: ``decompositions``, ``torch's global module
  hooks``, ``library attributes replaced by user code``
  (``fingerprint.replaced_library_attributes``), and the process-wide values each layer's
  config declares for the key where they are defined (``Config.include_in_graph_key``:
  ``setting <layer>.<name>`` for a setting, the declared name for a module's state);
* the process's inputs (``process_inputs``): ``command line``, ``working directory`` and
  one ``environment variable NAME`` per variable but ``IGNORED_ENVIRONMENT``;
* ``state layout`` (each slot's name, shape, dtype, ``requires_grad`` and which slots share
  a tensor) and ``inputs`` (shape, stride, dtype);
* the caller's ``selection`` (plain data: what selects a program in the caller, for cstorch
  its ``ProgramSignature`` rendered field by field, which holds the precision policy): one
  ``program signature: <field>`` part per field of a mapping;
* torch's global modes, one part each (an active torch function/dispatch mode makes a step
  not cacheable);
* the caller's ``extra`` (a mapping of named plain values, one part each).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import sys

import jax
import torch

from jax_backend import config
from jax_backend.config import graph_cache as setting, graph_cache_explain
from jax_backend.graph_cache import fingerprint
from jax_backend.state_guard import plain_type

#: The entry format; part of ``versions``, so an entry of another format is another key.
#: 5: the key is named parts, a metric's step closure is stored by its public name
#: (4: runtime scalars; 3: an optimizer step carries its spec)
FORMAT = 5

#: Environment variables left out of the key: they differ between terminal or SSH sessions
#: and say nothing a step could compute with (and the cache's own settings), and those the
#: libraries set themselves during a first trace (``fingerprint.LIBRARY_SET_ENVIRONMENT``).
IGNORED_ENVIRONMENT = (
    frozenset(
        {
            setting.env_var,
            graph_cache_explain.env_var,
            "_",
            "OLDPWD",
            "SSH_CLIENT",
            "SSH_CONNECTION",
            "SSH_TTY",
            "SSH_AUTH_SOCK",
            "XDG_SESSION_ID",
            "TERM_SESSION_ID",
            "WINDOWID",
            "TMUX_PANE",
        }
    )
    | fingerprint.LIBRARY_SET_ENVIRONMENT
)


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class StepKey:
    """A step's key: ``parts``, ``((name, sha256 hex), ...)`` in a fixed order, and
    ``digest``, the sha256 over them (the entry's name). ``step`` is the caller's name for
    the step (its function's qualified name and file, say): not part of the key, it is how
    a miss finds the step's stored entries to compare with."""

    parts: tuple
    step: str | None = dataclasses.field(default=None, compare=False)

    @functools.cached_property
    def digest(self) -> str:
        return _digest([list(part) for part in self.parts])

    def __str__(self) -> str:
        return self.digest

    def differences(self, other) -> list:
        """The names of the parts that differ from ``other`` (``(name, digest)`` pairs,
        digests possibly shortened to a prefix), in this key's order; a part only this key
        has ends in `` (new)``, one only ``other`` has in `` (gone)``."""
        theirs = dict(other)
        changed = [
            name if name in theirs else f"{name} (new)"
            for name, digest in self.parts
            if name not in theirs or not digest.startswith(theirs[name])
        ]
        ours = {name for name, _ in self.parts}
        return changed + [f"{name} (gone)" for name, _ in other if name not in ours]


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    """What an entry is valid for: its format and the versions of the libraries and Python."""
    try:
        project = importlib.metadata.version("cstorch-jax")
    except importlib.metadata.PackageNotFoundError:
        project = "unknown"
    return {
        "format": FORMAT,
        "torch": torch.__version__,
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "python": sys.version,
        "project": project,
    }


def _torch_modes() -> dict:
    """torch's global settings a trace can depend on. An active function or dispatch mode
    (``with SomeTorchFunctionMode():`` around the step) rewrites ops in ways we cannot key."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    if _get_current_function_mode_stack() or _get_current_dispatch_mode_stack():
        raise fingerprint.NotCacheable("a torch function or dispatch mode is active")
    return {
        "torch default dtype": str(torch.get_default_dtype()),
        "torch default device": str(torch.get_default_device()),
        "torch grad mode": torch.is_grad_enabled(),
        "torch inference mode": torch.is_inference_mode_enabled(),
        "torch deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "torch CPU autocast": torch.is_autocast_enabled("cpu"),
        "torch CPU autocast dtype": str(torch.get_autocast_dtype("cpu")),
    }


def process_inputs() -> dict:
    """What a step can read from the process rather than from its objects: the command
    line, the environment (less ``IGNORED_ENVIRONMENT``) and the working directory (what
    relative paths mean)."""
    return {
        "argv": list(sys.argv),
        "environment": {
            k: v for k, v in sorted(os.environ.items()) if k not in IGNORED_ENVIRONMENT
        },
        "cwd": os.getcwd(),
    }


def _tensor_signature(t: torch.Tensor) -> list:
    # The plain class: whether DeviceState has guarded a tensor yet must not change the key.
    return [list(t.shape), list(t.stride()), str(t.dtype), t.requires_grad, plain_type(t).__name__]


def _named(prefix: str, value, name: str) -> list:
    """A mapping as one part per key (``<prefix><key>``), anything else as the part ``name``."""
    if isinstance(value, dict):
        return [(f"{prefix}{k}", _digest(v)) for k, v in value.items()]
    return [(name, _digest(value))]


def step_key(
    fingerprinter: fingerprint.Fingerprinter,
    slots,
    inputs,
    selection,
    decompositions,
    extra,
    *,
    step: str | None = None,
) -> StepKey:
    """The key of capturing a step over ``slots`` and ``inputs`` (see the module docstring);
    ``selection`` and ``extra`` are plain data (JSON), the caller's rendering of what
    selects a program and anything else it keys (a mapping: one part per key); ``step``
    names the step for ``StepKey.step``. Raises ``fingerprint.NotCacheable`` if some part
    cannot be fingerprinted."""
    fingerprinter.add("decompositions", {str(op): fn for op, fn in (decompositions or {}).items()})
    fingerprinter.add("torch's global module hooks", fingerprint.torch_global_hooks())
    fingerprinter.add(
        "library attributes replaced by user code", fingerprint.replaced_library_attributes()
    )
    for layer in config.layers():
        for name, value in layer.graph_key_values():
            fingerprinter.add(name, value)
    process = process_inputs()
    index_of: dict = {}
    layout: list = []
    for slot in slots:
        tensor = slot.get()
        unique = index_of.setdefault(id(tensor), len(index_of))
        layout.append([slot.name or repr(slot.key), unique] + _tensor_signature(tensor))
    parts = [(f"version of {name}", _digest(value)) for name, value in versions().items()]
    parts += fingerprinter.parts
    parts += [
        ("command line", _digest(process["argv"])),
        ("working directory", _digest(process["cwd"])),
    ]
    parts += [
        (f"environment variable {name}", _digest(value))
        for name, value in process["environment"].items()
    ]
    parts += [
        ("state layout", _digest(layout)),
        ("inputs", _digest([_tensor_signature(t) for t in inputs])),
    ]
    parts += _named("program signature: ", selection, "program selection")
    parts += [(name, _digest(value)) for name, value in _torch_modes().items()]
    parts += _named("", extra, "extra")
    return StepKey(tuple(parts), step)
