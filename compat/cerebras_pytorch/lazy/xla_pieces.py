"""The pieces of PyTorch/XLA (``torch_xla``) the 1.6 Model Zoo imports, served only during a
1.x appliance run.

The 1.6 stack ran on PyTorch/XLA, and the 1.6 zoo imports two of its pieces directly once it
runs on a CS system (``cm.use_cs()``): fc_mnist's data functions build their fake data with
``torch_xla.utils.utils.SampleGenerator``, and the appliance runner names the state tensors
with ``torch_xla._XLAC._xla_set_parameter_name`` before an eval is traced. This engine is not
built on PyTorch/XLA, so those two are provided here, and nothing else of ``torch_xla``.

They must not look like an installed PyTorch/XLA to anything else: libraries ask
``importlib.util.find_spec("torch_xla")`` to decide whether they run on a TPU (transformers,
accelerate, torch's own ``torch.cuda.amp`` check). So there is no ``torch_xla`` package on
any path. ``serve()`` (called by ``cbtorch.initialize(appliance=True)``, which only the 1.x
appliance flow calls) puts a finder for exactly these modules at the end of
``sys.meta_path``; ``withdraw()`` (on ``cstorch.config.reset()``) removes it and forgets the
modules it loaded. Outside a 1.x appliance run ``import torch_xla`` fails and ``find_spec``
finds nothing, as in any environment without PyTorch/XLA. During one, ``torch_xla.core``
and every other PyTorch/XLA module stay absent (the 1.6 zoo's own TPU check,
``find_spec("torch_xla.core")``, answers no). Being last on ``sys.meta_path``, the finder
answers only where no real ``torch_xla`` is importable: an installed one wins.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

import torch

import cstorch


class SampleGenerator:
    """``torch_xla.utils.utils.SampleGenerator(data, sample_count)``: an iterable that hands
    out the same ``data`` ``sample_count`` times (its length); each ``iter()`` starts
    over."""

    def __init__(self, data, sample_count):
        count = int(sample_count)
        if count < 0:
            raise ValueError(f"SampleGenerator: sample_count must be >= 0, got {sample_count!r}")
        self._data = data
        self._sample_count = count

    def __len__(self):
        return self._sample_count

    def __iter__(self):
        for _ in range(self._sample_count):
            yield self._data


def _xla_set_parameter_name(tensor, name):
    """``torch_xla._XLAC._xla_set_parameter_name``: named a state tensor in XLA's graph. The
    engine names the step's state by its path in the model and optimizer itself, so there
    is nothing to record (arguments of the wrong type are refused)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"_xla_set_parameter_name: expected a tensor, got {type(tensor).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"_xla_set_parameter_name: expected a str name, got {type(name).__name__}")


_DOC = (
    "Pieces of PyTorch/XLA the 1.6 Model Zoo imports, provided by "
    "cerebras_pytorch.lazy.xla_pieces during a 1.x appliance run (not PyTorch/XLA)."
)

# module name -> its attributes (a name with children is a package)
MODULES = {
    "torch_xla": {},
    "torch_xla._XLAC": {"_xla_set_parameter_name": _xla_set_parameter_name},
    "torch_xla.utils": {},
    "torch_xla.utils.utils": {"SampleGenerator": SampleGenerator},
}


class XlaPiecesFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the modules of ``MODULES`` (and no other name)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MODULES:
            return None
        package = any(name.startswith(fullname + ".") for name in MODULES)
        return importlib.util.spec_from_loader(fullname, self, origin=__name__, is_package=package)

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        module.__doc__ = _DOC
        for key, value in MODULES[module.__name__].items():
            setattr(module, key, value)
        for child in MODULES:  # `import torch_xla` offers `torch_xla._XLAC` ... as attributes
            parent, _, name = child.rpartition(".")
            if parent == module.__name__:
                setattr(module, name, importlib.import_module(child))


_finder = XlaPiecesFinder()


def serving() -> bool:
    return _finder in sys.meta_path


def serve() -> None:
    """Makes the pieces importable (once; last on ``sys.meta_path``)."""
    if not serving():
        sys.meta_path.append(_finder)


def withdraw() -> None:
    """Removes the finder and forgets the modules it loaded (a real ``torch_xla`` that was
    imported instead stays)."""
    while _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module.__spec__, "loader", None) is _finder:
            del sys.modules[name]


cstorch.config.config.on_reset(withdraw)  # cstorch.config.reset()
