"""Every exception class of the engine (``jax_backend``) and the API (``cstorch``) derives
from one root, ``jax_backend.errors.CstorchError`` (also ``cstorch.errors.CstorchError``), a
mixin beside each class's natural built-in base: ``except CstorchError`` catches them all,
``except ValueError`` still catches a ``TreeSpecError``. Warnings are not errors and are left
out. The classes are found by importing every module of both packages."""

import importlib
import inspect
import pkgutil

import pytest

import cstorch
import jax_backend
from jax_backend.errors import CstorchError


def exception_classes() -> dict:
    """``{"module.Class": class}`` for every exception class defined in the two packages."""
    found = {}
    for package in (jax_backend, cstorch):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.rpartition(".")[2] == "__main__":  # a command line, run on import
                continue
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__
                    and not issubclass(obj, Warning)
                ):
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_engine_and_api_error_has_the_one_root():
    classes = exception_classes()
    assert len(classes) >= 25  # the walk did find the packages' classes
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, CstorchError))
    assert not outside, (
        "exception classes outside jax_backend.errors.CstorchError (add it as the first base, "
        f"keeping the built-in one: class MyError(CstorchError, ValueError)): {outside}"
    )


def test_the_root_is_a_mixin_that_keeps_the_built_in_bases():
    from cstorch.errors import CstorchError as api_root
    from cstorch.storage.treespec import TreeSpecError
    from jax_backend.errors import LoweringNotFoundError
    from jax_backend.regular_files import NotARegularFileError

    assert api_root is CstorchError and CstorchError.__bases__ == (Exception,)
    assert issubclass(TreeSpecError, ValueError)
    assert issubclass(LoweringNotFoundError, NotImplementedError)
    error = NotARegularFileError(2, "not a regular file", "/dev/null")  # OSError's fields
    assert (error.errno, error.filename) == (2, "/dev/null")
    with pytest.raises(CstorchError):
        raise TreeSpecError("a bad tree")
    with pytest.raises(ValueError):
        raise TreeSpecError("a bad tree")
