"""Names that YAML configs use for user code: models and data processors.

``model: {name: MyModel, ...}`` and ``data_processor: MyData`` resolve through this registry
(filled with ``@register_model("MyModel")`` / ``@register_data_processor("MyData")``) or, for
a name containing a colon or dot, as an import path (``package.module:Class``).

A config is shared between people, so an import path may only name what its key asks for,
checked before anything is called: a model is a ``torch.nn.Module`` subclass, a data
processor a class that builds a dataloader (``create_dataloader``, a ``DataLoader`` or
``IterableDataset`` subclass); a function qualifies only by declaring that it returns one
(``def data(...) -> torch.utils.data.DataLoader``). Otherwise ``model: {name: os:system}``
would run a shell command. Registered names are trusted as they are: the code that
registered them already ran.
"""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import typing

import torch

_MODELS: dict = {}
_DATA_PROCESSORS: dict = {}


def _register(table, kind, name):
    def decorate(obj):
        key = name or obj.__name__
        if key in table and table[key] is not obj:
            raise ValueError(f"A {kind} named {key!r} is already registered ({table[key]!r}).")
        table[key] = obj
        return obj

    return decorate


def register_model(name: str = None):
    """Registers a model class (or factory) under ``name`` (default: its ``__name__``)."""
    return _register(_MODELS, "model", name)


def register_data_processor(name: str = None):
    """Registers a data processor (a class or function returning an iterable of batches)."""
    return _register(_DATA_PROCESSORS, "data processor", name)


def import_object(path: str):
    """``"package.module:Attr"`` or ``"package.module.Attr"`` -> the object."""
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"{path!r} is not an import path; write it as package.module:Name.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"Cannot import module {module_name!r} for {path!r}: {error}. Check "
                         "the name and that its directory is on PYTHONPATH.") from error
    obj = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"Module {module_name!r} has no attribute {attribute!r} (from "
                             f"{path!r}).")
        obj = getattr(obj, part)
    return obj


# ------------------------------------------------------------------ what an import path may be
def _declared_return(function):
    """The return annotation of a Python function (resolved), or None."""
    if not inspect.isfunction(function):
        return None  # builtins (os.system) and other callables declare nothing checkable
    try:
        annotation = inspect.signature(function, eval_str=True).return_annotation
    except Exception:  # noqa: BLE001 - an annotation that does not resolve declares nothing
        return None
    return None if annotation is inspect.Signature.empty else annotation


def _is_model(obj) -> bool:
    if isinstance(obj, type):
        return issubclass(obj, torch.nn.Module)
    declared = _declared_return(obj)
    return isinstance(declared, type) and issubclass(declared, torch.nn.Module)


def _builds_batches(cls) -> bool:
    return isinstance(cls, type) and (
        issubclass(cls, (torch.utils.data.DataLoader, torch.utils.data.IterableDataset))
        or callable(getattr(cls, "create_dataloader", None)))


def _is_data_processor(obj) -> bool:
    if isinstance(obj, type):
        return _builds_batches(obj)
    declared = _declared_return(obj)
    if _builds_batches(declared):
        return True
    origin = typing.get_origin(declared) or declared
    return origin in (collections.abc.Iterable, collections.abc.Iterator,
                      collections.abc.Generator)


_KINDS = {
    "model": (_is_model, "a torch.nn.Module subclass",
              "a function declared to return one (`def build(...) -> MyModel`)"),
    "data processor": (_is_data_processor,
                       "a data processor (a class with create_dataloader(), or a DataLoader "
                       "or IterableDataset subclass)",
                       "a function declared to return one "
                       "(`def data(...) -> torch.utils.data.DataLoader`)"),
}


def _resolve(table, kind, name):
    if not isinstance(name, str) or not name:
        raise ValueError(f"Expected the {kind} name to be a non-empty string, got {name!r}.")
    if name in table:
        return table[name]
    if ":" in name or "." in name:
        obj = import_object(name)
        accepts, what, function = _KINDS[kind]
        if not accepts(obj):
            raise ValueError(
                f"{name!r} is not {what}, nor {function}; a config may only name those, so "
                f"that loading it cannot run other code. Name the right object, or register "
                f"it with @register_{kind.replace(' ', '_')}.")
        return obj
    known = ", ".join(sorted(table)) or "none registered"
    raise ValueError(
        f"Unknown {kind} {name!r} (registered: {known}). Register it with "
        f"@register_{kind.replace(' ', '_')}({name!r}) in a module the run imports, or give "
        "an import path such as my_package.models:MyModel.")


def get_model(name: str):
    return _resolve(_MODELS, "model", name)


def get_data_processor(name: str):
    return _resolve(_DATA_PROCESSORS, "data processor", name)


# ------------------------------------------------------------------ arguments by signature
def check_arguments(target, kwargs: dict, label: str, *, passed=(), ignore=(), also=(),
                    required: bool = True) -> None:
    """Raises ValueError (one line: ``label: unknown argument 'x'; accepted: ...``) unless
    ``target(*passed, **kwargs)`` fits ``target``'s signature. ``passed`` names the
    parameters the framework fills (``params``, ``optimizer``); ``ignore`` names keys that
    are checked elsewhere, ``also`` other accepted names (aliases); ``required=False`` leaves missing arguments to defaults set
    elsewhere. A target without a readable signature, or taking ``**kwargs``, accepts any
    name."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = [p for p in signature.parameters.values() if p.name not in passed]
    accepted = [p.name for p in parameters if p.kind in named] + list(also)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        unknown = [key for key in kwargs if key not in accepted and key not in ignore]
        if unknown:
            plural = "s" if len(unknown) > 1 else ""
            raise ValueError(f"{label}: unknown argument{plural} "
                             f"{', '.join(map(repr, unknown))}; accepted: "
                             f"{', '.join(accepted) or 'none'}")
    if required:
        missing = [p.name for p in parameters if p.kind in named
                   and p.default is inspect.Parameter.empty and p.name not in kwargs]
        if missing:
            plural = "s" if len(missing) > 1 else ""
            raise ValueError(f"{label}: missing argument{plural} "
                             f"{', '.join(map(repr, missing))}")
