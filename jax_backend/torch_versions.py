"""What differs between the torch releases this project supports (pyproject's range), each
difference found by looking for the feature, never by comparing version strings."""

from __future__ import annotations


def treespec_children(spec) -> list:
    """The child specs of a ``torch.utils._pytree.TreeSpec``.

    ``TreeSpec.children()`` is the current spelling (from torch 2.10; 2.13 deprecates the old
    field with a FutureWarning); torch 2.9 has only the ``children_specs`` field."""
    children = getattr(spec, "children", None)
    if callable(children):
        return list(children())
    return list(spec.children_specs)
