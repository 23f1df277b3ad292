"""Import aliasing: make ``<alias>.X.Y`` resolve to the very module objects ``<target>.X.Y``.

Re-exporting is not enough: ``import cerebras.pytorch.optim`` would otherwise load a second
copy of ``cstorch.optim`` under another name, with its own classes, and isinstance checks
between the two would fail.

Every alias of an already-loaded module is entered in ``sys.modules`` directly. Loading an
alias through the import system would make Python set it as an attribute of its parent
package, replacing a same-named attribute: ``cstorch.backend`` (a function that is also a
module name) would become the module after ``from cerebras.pytorch.backend import X``.

The finder for modules not loaded yet goes right before Python's path finder, not first:
every finder already there keeps its place and order (an import hook the user installed
still sees every import first). It must come before the path finder, which would find
``<alias>.X`` in the target's directory (the alias's ``__path__``) and load a second copy.
It is installed only when an alias package is imported, so a real install of that package
earlier on the path, which is then imported instead, shadows it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys


class AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, alias: str, target: str):
        self.alias = alias
        self.target = target

    def _target_name(self, fullname: str) -> str | None:
        if fullname.startswith(self.alias + "."):
            return self.target + fullname[len(self.alias) :]
        return None

    def find_spec(self, fullname, path=None, target=None):
        real = self._target_name(fullname)
        if real is None:
            return None
        if not target_exists(real):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(self._target_name(spec.name))
        self._original_spec = module.__spec__
        _alias_loaded(self.alias, self.target)
        return module

    def exec_module(self, module):
        module.__spec__ = self._original_spec  # keep the real module's identity intact


def target_exists(name: str) -> bool:
    """Whether module ``name`` can be imported; false also where a parent package is missing
    (``find_spec`` raises then), so the alias's own directory is searched instead."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def add_finder(finder: AliasFinder) -> None:
    """Puts ``finder`` right before Python's path finder (see the module docstring), once."""
    if any(type(f) is type(finder) and f.alias == finder.alias for f in sys.meta_path):
        return
    position = next(
        (i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
        len(sys.meta_path),
    )
    sys.meta_path.insert(position, finder)


def install(alias: str, target: str) -> None:
    """Makes ``alias`` and all its submodules the modules of ``target``."""
    add_finder(AliasFinder(alias, target))
    sys.modules[alias] = importlib.import_module(target)
    _alias_loaded(alias, target)


def _alias_loaded(alias: str, target: str) -> None:
    """Enters ``alias.X`` in ``sys.modules`` for every loaded ``target.X``."""
    prefix = target + "."
    for name, module in list(sys.modules.items()):
        if name.startswith(prefix):
            sys.modules.setdefault(alias + name[len(target) :], module)
