"""What the Cerebras Model Zoo 2.10 needs from the torch this project runs on.

The zoo was written against torch 2.4. Its trainer config (``trainer/validate.py``,
``TrainerConfig.replace_tuple_with_list``) rebuilds the pytree spec of a config with
``dataclasses.replace(spec, type=..., children_specs=...)``. In torch 2.4 ``TreeSpec``'s
dataclass fields were ``type, context, children_specs``, the names its ``__init__`` takes;
later torch renamed the fields ``_context`` and ``_children`` but kept the old ``__init__``
keywords, so ``dataclasses.replace`` (which passes every field by name) raises
``TypeError: TreeSpec.__init__() got an unexpected keyword argument '_context'`` and every
``cszoo fit`` / ``run.py`` stops before the first step.

``install()`` makes ``TreeSpec.__init__`` also accept its fields' names, which is all
``dataclasses.replace`` needs; every call that worked before means the same. It changes
torch's class, so it runs only where the zoo runs: it is installed by
``cerebras.appliance.utils`` (this project's stand-in for the appliance package), which the
zoo's trainer imports, and nowhere at ``import cerebras.pytorch``. A torch whose ``TreeSpec``
already takes those names (or has no ``_context`` field) is left alone.
"""

from __future__ import annotations

import dataclasses
import functools

_MISSING = object()


def _needs_tolerance(treespec_cls) -> bool:
    if not dataclasses.is_dataclass(treespec_cls):
        return False
    names = {f.name for f in dataclasses.fields(treespec_cls) if f.init}
    return "_context" in names and "context" not in names


def install() -> bool:
    """Lets ``dataclasses.replace`` rebuild a ``torch.utils._pytree.TreeSpec`` (idempotent).
    Returns whether the tolerance is in place."""
    from torch.utils._pytree import TreeSpec

    if getattr(TreeSpec.__init__, "_zoo_tolerant", False):
        return True
    if not _needs_tolerance(TreeSpec):
        return False
    original = TreeSpec.__init__

    @functools.wraps(original)
    def __init__(
        self,
        type,
        context=_MISSING,
        children_specs=_MISSING,
        *,
        _context=_MISSING,
        _children=_MISSING,
    ):
        # The old keywords win: dataclasses.replace(spec, children_specs=...) passes both the
        # new children and the old ``_children`` field value.
        if context is _MISSING:
            context = None if _context is _MISSING else _context
        if children_specs is _MISSING:
            children_specs = [] if _children is _MISSING else _children
        original(self, type, context, children_specs)

    __init__._zoo_tolerant = True
    TreeSpec.__init__ = __init__
    return True
