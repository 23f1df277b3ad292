"""Naming helpers: ``name_scope`` and the debug names of modules."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from cstorch import config

_debug_scope = ""


@contextlib.contextmanager
def name_scope(name: str, raw: bool = False):
    """Names the operations traced inside the block (needs a backend; ``raw`` is unused)."""
    from cstorch.backend import current_backend_impl

    with current_backend_impl().name_scope(name):
        yield


def set_debug_scope(name: str) -> None:
    """Sets (or, with a falsy ``name``, clears) the global debug scope name."""
    global _debug_scope
    _debug_scope = name or ""


def get_debug_scope() -> str:
    """The debug scope set by ``set_debug_scope`` ("" if none)."""
    return _debug_scope


config.config.include_in_graph_key("cstorch debug scope", get_debug_scope)


def add_debug_name(module: torch.nn.Module, root_name: Optional[str] = None) -> None:
    """Sets ``_debug_name`` on ``module`` and every descendant to its dotted path under
    ``root_name``."""

    def visit(mod, name):
        mod._debug_name = name
        for child_name, child in mod.named_children():
            visit(child, ".".join(part for part in (name, child_name) if part))

    visit(module, root_name or "")


def get_debug_name(module: torch.nn.Module) -> str:
    """The module's ``_debug_name`` if set and non-empty, else its class name."""
    return getattr(module, "_debug_name", None) or type(module).__name__
