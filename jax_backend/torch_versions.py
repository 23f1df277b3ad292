"""What differs between the torch releases this project supports (pyproject's range), each
difference found by looking for the feature, never by comparing version strings."""

from __future__ import annotations

import os
import sys


def treespec_children(spec) -> list:
    """The child specs of a ``torch.utils._pytree.TreeSpec``.

    ``TreeSpec.children()`` is the current spelling (from torch 2.10; 2.13 deprecates the old
    field with a FutureWarning); torch 2.9 has only the ``children_specs`` field."""
    children = getattr(spec, "children", None)
    if callable(children):
        return list(children())
    return list(spec.children_specs)


def generated_source_dirs() -> tuple:
    """Directories (with a trailing separator) where this torch writes Python source it
    generates at run time: torch 2.9 writes ``_remote_module_non_scriptable.py`` into a new
    temporary directory whenever ``torch.distributed.nn`` is imported, so its path differs
    from run to run. Later releases write none."""
    instantiator = sys.modules.get("torch.distributed.nn.jit.instantiator")
    name = getattr(getattr(instantiator, "_TEMP_DIR", None), "name", None)
    return (os.path.abspath(name) + os.sep,) if isinstance(name, str) else ()
