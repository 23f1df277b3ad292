"""Stand-ins for the zoo's evaluation harnesses (``lm_eval``, ``bigcode_eval``), used only by
the zoo check (tests/zoo).

The zoo's trainer config imports its eval-harness extensions, which import these packages at
module level; ``bigcode_eval`` is not on PyPI and ``lm_eval`` brings a large stack that
training never uses. Every name is an importable placeholder (subclassable, reachable by
attribute, usable as a decorator: ``@register_model("x")`` returns the class unchanged);
anything else created or called raises, so no evaluation silently runs without the harness.
"""

import importlib.abc
import importlib.machinery
import sys
import typing


def _why(qualname):
    return (
        f"{qualname} is not available: this is the zoo check's stand-in for the "
        "evaluation harness (install lm-eval / bigcode-evaluation-harness to evaluate)."
    )


# The metaclass of typing.Protocol (an ABCMeta): the zoo mixes these with ABCs and protocols.
class _Missing(type(typing.Protocol)):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        if (
            len(args) == 1
            and not kwargs
            and isinstance(args[0], type)
            or (
                len(args) == 1
                and not kwargs
                and callable(args[0])
                and not isinstance(args[0], _Missing)
            )
        ):
            return args[0]  # used as a decorator
        if args and all(isinstance(a, str) for a in args) and not kwargs:
            return placeholder(f"{cls.__qualname__}(...)")  # a decorator factory
        raise ImportError(_why(cls.__qualname__))


def placeholder(qualname: str) -> type:
    return _Missing(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname})


def _module_getattr(module):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{module}.{name}")

    return __getattr__


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, package):
        self.package = package

    def find_spec(self, name, path=None, target=None):
        if name.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = _module_getattr(module.__name__)


def install(module) -> None:
    """Makes ``module`` (a package's ``__init__``) and all its submodules stand-ins."""
    module.__getattr__ = _module_getattr(module.__name__)
    sys.meta_path.insert(0, _Finder(module.__name__))
