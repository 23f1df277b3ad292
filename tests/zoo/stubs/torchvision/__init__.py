"""A stand-in for ``torchvision`` used only by the Model Zoo check (tests/zoo).

PyPI's torchvision wheels are built against CUDA torch and do not load beside this project's
CPU torch 2.13 (``operator torchvision::nms does not exist``). The zoo imports torchvision at
module level in its vision data code, but fc_mnist's and GPT-2's fake-data paths never use it;
this stand-in lets those imports succeed (every ``torchvision.*`` submodule exists, every name
in it is a placeholder) and raises as soon as anything is created or called. It has no package
metadata, so libraries that probe for torchvision (transformers) see none.
"""

import importlib.abc
import importlib.machinery
import sys

from ._unavailable import refuse

__version__ = "0.0+zoo-check-stand-in"
__getattr__ = refuse(__name__)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(__name__ + ".") and name != f"{__name__}._unavailable":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = refuse(module.__name__)


sys.meta_path.insert(0, _Finder())
