"""Names that YAML configs use for user code: models and data processors.

``model: {name: MyModel, ...}`` and ``data_processor: MyData`` resolve through this registry
(filled with ``@register_model("MyModel")`` / ``@register_data_processor("MyData")``) or, for
a name containing a colon or dot, as an import path (``package.module:Class``).
"""

from __future__ import annotations

import importlib

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


def _resolve(table, kind, name):
    if not isinstance(name, str) or not name:
        raise ValueError(f"Expected the {kind} name to be a non-empty string, got {name!r}.")
    if name in table:
        return table[name]
    if ":" in name or "." in name:
        return import_object(name)
    known = ", ".join(sorted(table)) or "none registered"
    raise ValueError(
        f"Unknown {kind} {name!r} (registered: {known}). Register it with "
        f"@register_{kind.replace(' ', '_')}({name!r}) in a module the run imports, or give "
        "an import path such as my_package.models:MyModel.")


def get_model(name: str):
    return _resolve(_MODELS, "model", name)


def get_data_processor(name: str):
    return _resolve(_DATA_PROCESSORS, "data processor", name)
