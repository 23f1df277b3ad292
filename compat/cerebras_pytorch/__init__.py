"""``cerebras_pytorch``: the import name of cstorch in releases 2.0 and 2.1.

``import cerebras_pytorch as cstorch`` gives a module whose every attribute is cstorch's own
object, and whose submodules (``cerebras_pytorch.optim``, ``.utils.data``, ...) are the very
module objects of cstorch, so classes and isinstance checks are shared.

One name differs: ``cerebras_pytorch.experimental`` is the 1.8/1.9 API
(``import cerebras_pytorch.experimental as cstorch``; see that package), not cstorch 2.10's
``experimental`` module, whose names it also offers. That is why this top-level module is a
thin forwarder rather than ``cstorch`` itself: ``import a.b as c`` reads attribute ``b`` of
``a``, which on ``cstorch`` would be the 2.10 module.
"""

import sys as _sys
import warnings as _warnings

import cstorch as _cstorch
from cstorch.utils._import_alias import AliasFinder as _AliasFinder, add_finder as _add_finder


class _AliasAllButExperimental(_AliasFinder):
    def _target_name(self, fullname):
        if fullname == "cerebras_pytorch.experimental" or fullname.startswith(
                "cerebras_pytorch.experimental."):
            return None
        return super()._target_name(fullname)


# The 1.8 API must be in sys.modules before any cstorch submodule is aliased: aliasing fills
# in ``cerebras_pytorch.<name>`` for every loaded ``cstorch.<name>`` that is not yet present.
from cerebras_pytorch import experimental as experimental  # noqa: E402

_add_finder(_AliasAllButExperimental("cerebras_pytorch", "cstorch"))
for _name, _module in list(_sys.modules.items()):
    if _name.startswith("cstorch.") and not _name.startswith("cstorch.experimental"):
        _sys.modules.setdefault("cerebras_pytorch" + _name[len("cstorch"):], _module)

__all__ = list(_cstorch.__all__)
__version__ = "2.1.1"  # the API generation this name stands for


def manual_seed(seed: int):
    """Deprecated 2.0/2.1 helper: seeds torch (``torch.manual_seed``), which also seeds the
    compiled steps' randomness."""
    import torch

    _warnings.warn("cerebras_pytorch.manual_seed is deprecated; call torch.manual_seed.",
                   DeprecationWarning, stacklevel=2)
    return torch.manual_seed(seed)


def __getattr__(name):
    return getattr(_cstorch, name)


def __dir__():
    return sorted(set(dir(_cstorch)) | {"experimental", "manual_seed"})
