"""Import aliasing: make ``<alias>.X.Y`` resolve to the very module objects ``<target>.X.Y``.

Re-exporting is not enough: ``import cerebras.pytorch.optim`` would otherwise load a second
copy of ``cstorch.optim`` under another name, with its own classes, and isinstance checks
between the two would fail.

Every alias of an already-loaded module is entered in ``sys.modules`` directly. Loading an
alias through the import system would make Python set it as an attribute of its parent
package, replacing a same-named attribute: ``cstorch.backend`` (a function that is also a
module name) would become the module after ``from cerebras.pytorch.backend import X``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys


class AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, alias: str, target: str):
        self.alias = alias
        self.target = target

    def _target_name(self, fullname: str) -> str | None:
        if fullname.startswith(self.alias + "."):
            return self.target + fullname[len(self.alias):]
        return None

    def find_spec(self, fullname, path=None, target=None):
        real = self._target_name(fullname)
        if real is None:
            return None
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(self._target_name(spec.name))
        self._original_spec = module.__spec__
        _alias_loaded(self.alias, self.target)
        return module

    def exec_module(self, module):
        module.__spec__ = self._original_spec  # keep the real module's identity intact


def install(alias: str, target: str) -> None:
    """Makes ``alias`` and all its submodules the modules of ``target``."""
    if not any(isinstance(f, AliasFinder) and f.alias == alias for f in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder(alias, target))
    sys.modules[alias] = importlib.import_module(target)
    _alias_loaded(alias, target)


def _alias_loaded(alias: str, target: str) -> None:
    """Enters ``alias.X`` in ``sys.modules`` for every loaded ``target.X``."""
    prefix = target + "."
    for name, module in list(sys.modules.items()):
        if name.startswith(prefix):
            sys.modules.setdefault(alias + name[len(target):], module)
