"""``cerebras_pytorch``: the import name of cstorch in releases 2.0 and 2.1.

``import cerebras_pytorch as cstorch`` gives a module whose every attribute is cstorch's own
object, and whose submodules (``cerebras_pytorch.optim``, ``.utils.data``, ...) are the very
module objects of cstorch, so classes and isinstance checks are shared.

One name differs: ``cerebras_pytorch.experimental`` is the 1.8/1.9 API
(``import cerebras_pytorch.experimental as cstorch``; see that package), not cstorch 2.10's
``experimental`` module, whose names it also offers. That is why this top-level module is a
thin forwarder rather than ``cstorch`` itself: ``import a.b as c`` reads attribute ``b`` of
``a``, which on ``cstorch`` would be the 2.10 module.

Releases 1.6 to 1.9 used this name too, for the lazy-tensor API their Model Zoo runners drive
(``cbtorch.initialize/module/optimizer/dataloader/state``, ``cbtorch.core.cb_model``,
``cbtorch.core.appliance``): those names live in ``cerebras_pytorch.lazy`` and are reached
under their 1.x names (``_OLDER_ONLY`` below; top-level functions through ``__getattr__``).
A 1.x name never hides a cstorch one: where cstorch has the module, the alias wins. The one
exception is only in force during a 1.x appliance run (``cbtorch.initialize(appliance=True)``,
which 2.x code never calls): ``cbtorch.optim.lr_scheduler`` then offers the 1.x schedule
classes, several of whose names cstorch uses for different 2.x classes.
"""

import importlib as _importlib
import importlib.util as _importlib_util
import sys as _sys
import warnings as _warnings

import cstorch as _cstorch
from cstorch.utils._import_alias import (
    AliasFinder as _AliasFinder,
    add_finder as _add_finder,
    target_exists as _target_exists,
)

# 1.x module names -> the compat module that provides them (used where cstorch has none).
_OLDER_ONLY = {
    "cerebras_pytorch.core.cb_model": "cerebras_pytorch.lazy.cb_model",
    "cerebras_pytorch.core.appliance": "cerebras_pytorch.lazy.appliance",
    "cerebras_pytorch.pb": "cerebras_appliance.pb",  # 1.6 imported the config types here
    "cerebras_pytorch.pb.stack": "cerebras_appliance.pb.stack",
    "cerebras_pytorch.pb.stack.autogen_pb2": "cerebras_appliance.pb.stack.autogen_pb2",
}
# Packages of this directory: not aliased. ``amp`` is cstorch.amp plus the 1.x names (see
# that package); its submodules are still cstorch's. ``saver`` is cstorch's saver plus the
# 1.x appliance runner's piecewise checkpoint writing.
_OWN = ("cerebras_pytorch.experimental", "cerebras_pytorch.lazy", "cerebras_pytorch.saver")
_OWN_EXACT = ("cerebras_pytorch.amp",)


class _AliasAllButExperimental(_AliasFinder):
    def _target_name(self, fullname):
        if fullname in _OWN_EXACT or any(
            fullname == own or fullname.startswith(own + ".") for own in _OWN
        ):
            return None
        return super()._target_name(fullname)

    def find_spec(self, fullname, path=None, target=None):
        spec = super().find_spec(fullname, path, target)
        if spec is None and fullname in _OLDER_ONLY:
            return _importlib_util.spec_from_loader(fullname, self)
        return spec

    def create_module(self, spec):
        real = self._target_name(spec.name)
        if spec.name in _OLDER_ONLY and (real is None or not _target_exists(real)):
            module = _importlib.import_module(_OLDER_ONLY[spec.name])
            self._original_spec = module.__spec__
            return module
        return super().create_module(spec)


# The 1.8 API must be in sys.modules before any cstorch submodule is aliased: aliasing fills
# in ``cerebras_pytorch.<name>`` for every loaded ``cstorch.<name>`` that is not yet present.
from cerebras_pytorch import amp as amp, experimental as experimental, saver as saver  # noqa: E402

_add_finder(_AliasAllButExperimental("cerebras_pytorch", "cstorch"))
for _name, _module in list(_sys.modules.items()):
    if _name.startswith("cstorch.") and not _name.startswith("cstorch.experimental"):
        _sys.modules.setdefault("cerebras_pytorch" + _name[len("cstorch") :], _module)


def _add_older_only_attributes():
    """1.x names the zoo reads as attributes of modules cstorch shares with this alias
    (``cbtorch.utils.extract_loss``, ``cbtorch.utils.utils.is_ltc_mlir_mode_enabled``, and
    ``from cerebras_pytorch.core import cb_model, modes``, which Python resolves on the
    shared ``cstorch.core`` module itself); added only where the module lacks the name."""
    import cstorch.utils
    import cstorch.utils.nest
    import cstorch.utils.utils
    from cerebras_pytorch.lazy import api

    for module, name, value in (
        (cstorch.utils, "extract_loss", api.extract_loss),
        (cstorch.utils.utils, "is_ltc_mlir_mode_enabled", api.is_ltc_mlir_mode_enabled),
        # 1.6: the run's tensors were XLA tensors; here they are torch tensors.
        (cstorch.utils.nest, "visit_xla_tensors", cstorch.utils.nest.visit_torch_tensors),
        (cstorch.utils.nest, "map_xla_tensors", cstorch.utils.nest.map_torch_tensors),
    ):
        if not hasattr(module, name):
            setattr(module, name, value)
    for alias, provider in _OLDER_ONLY.items():
        parent_alias, _, name = alias.rpartition(".")
        if parent_alias == "cerebras_pytorch":  # a child of this module: the finder serves it
            continue
        parent_real = "cstorch" + parent_alias[len("cerebras_pytorch") :]
        parent = _sys.modules.get(parent_real)
        if parent is None or hasattr(parent, name) or _target_exists(parent_real + "." + name):
            continue
        module = _importlib.import_module(provider)
        setattr(parent, name, module)
        _sys.modules.setdefault(alias, module)


_add_older_only_attributes()

__all__ = list(_cstorch.__all__)
__version__ = "2.1.1"  # the API generation this name stands for


def manual_seed(seed: int):
    """Deprecated 2.0/2.1 helper: seeds torch (``torch.manual_seed``), which also seeds the
    compiled steps' randomness."""
    import torch

    _warnings.warn(
        "cerebras_pytorch.manual_seed is deprecated; call torch.manual_seed.",
        DeprecationWarning,
        stacklevel=2,
    )
    return torch.manual_seed(seed)


def name_scope(name: str, raw: bool = False):
    """``cstorch.name_scope``; without a backend (a 1.x CPU run: the zoo's ``PyTorchRunner``
    wraps its optimizer step in ``cbtorch.name_scope("optimizer")``) a no-op, as 1.x was off
    the Cerebras stack."""
    import contextlib

    if _cstorch.backend() is None:
        return contextlib.nullcontext()
    return _cstorch.name_scope(name)


def __getattr__(name):
    if name == "optim":
        from cerebras_pytorch.lazy import _run

        if _run.current().appliance:  # a 1.x appliance run: the 1.x schedule classes
            from cerebras_pytorch.lazy.optim import optim_view

            return optim_view()
    if hasattr(_cstorch, name):
        return getattr(_cstorch, name)
    from cerebras_pytorch.lazy import api as _lazy_api  # the 1.x names (initialize, module, ...)

    if name in _lazy_api.__all__:
        return getattr(_lazy_api, name)
    return getattr(_cstorch, name)  # raises cstorch's AttributeError (it may say where it went)


def __dir__():
    from cerebras_pytorch.lazy import api as _lazy_api

    return sorted(
        set(dir(_cstorch)) | {"experimental", "manual_seed", "name_scope"} | set(_lazy_api.__all__)
    )
