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

Importing a module runs its top level, so the module an import path names is located first
(``import_object``: the import system's finders, asked without importing any package above
it) and imported only if a config may name it (``IMPORT_RULE``): a module already imported
(importing it again runs nothing); a module given with ``cszoo --import MODULE`` or
``allow_imports(MODULE)``, or inside one; or a module of the run's own code, found on the
import path outside the Python installation (the standard library, ``site-packages`` and
the other install directories; the working directory and ``PYTHONPATH`` are the run's own),
with every package above it that is not imported yet. Never a ``__main__`` module (a command
line, which importing runs). So ``callbacks: [this:X]`` or ``venv.__main__:X`` is refused
with nothing run; ``--import this`` would allow the first.
"""

from __future__ import annotations

import collections.abc
import importlib
import importlib.machinery
import inspect
import os
import site
import sys
import sysconfig
import typing

import torch

from cstorch import config as cstorch_config
from cstorch.errors import quoted

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


# ------------------------------------------------------------------- which modules a config may import
IMPORT_RULE = (
    "a config may name only modules already imported, modules given with --import "
    "(or registry.allow_imports), or the run's own code (outside the standard "
    "library and installed packages), never a __main__ module"
)

_ALLOWED_IMPORTS: set = set()  # module names (with their submodules) a config may import


def allow_imports(*module_names: str) -> None:
    """Lets configs name ``module_names`` and the modules inside them (``cszoo --import``)."""
    for name in module_names:
        if not isinstance(name, str) or not name:
            raise TypeError(f"allow_imports takes module names, got {name!r}.")
        _ALLOWED_IMPORTS.add(name)


cstorch_config.config.on_reset(_ALLOWED_IMPORTS.clear)


def shown(name) -> str:
    """A name from a config as a message shows it: as written when it is a short line of
    text, else a short quote (a config is a foreign file: ``quoted``)."""
    if isinstance(name, str) and len(name) <= 80 and name.isprintable():
        return name
    return quoted(name)


def _allowed(name: str) -> bool:
    return any(name == allowed or name.startswith(allowed + ".") for allowed in _ALLOWED_IMPORTS)


def _installation() -> list:
    """The directories of the Python installation: the standard library, site-packages (the
    environment's, the base interpreter's, the user's) and the standard library's zip."""
    roots = set()
    bases = {None: None, "base": {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}}
    for variables in bases.values():
        paths = sysconfig.get_paths(vars=variables) if variables else sysconfig.get_paths()
        roots.update(
            paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(key)
        )
    roots.update(getattr(site, "getsitepackages", lambda: [])())
    roots.add(site.getusersitepackages())
    version = f"python{sys.version_info.major}{sys.version_info.minor}.zip"
    for prefix in {sys.prefix, sys.base_prefix}:
        roots.update((os.path.join(prefix, "lib", version), os.path.join(prefix, version)))
    return [os.path.realpath(root) for root in roots if root]


def _inside(path: str, roots) -> bool:
    path = os.path.realpath(path)
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def _find_spec(name: str, search_path):
    """The import system's spec for ``name`` (in the package whose ``__path__`` is
    ``search_path``), asked of ``sys.meta_path``'s finders as ``import`` does, without
    importing anything (``importlib.util.find_spec`` imports the packages above ``name``)."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        spec = find_spec(name, search_path, None)
        if spec is not None:
            return spec
    return None


def _refusal(path: str, name: str, spec) -> str | None:
    """Why a config may not import ``name`` (not imported yet, ``spec`` located), or None."""
    if _allowed(name):
        return None
    if spec.origin in ("built-in", "frozen"):
        return f"{name!r} is a {spec.origin} module of Python, not imported"
    locations = list(spec.submodule_search_locations or [])
    if spec.origin is None or spec.origin == "namespace":
        if (
            locations
            or spec.loader is None
            or isinstance(spec.loader, importlib.machinery.NamespaceLoader)
        ):
            return None  # a namespace package: no code of its own
        return f"{name!r} has no file to check (its loader is {type(spec.loader).__name__})"
    if _inside(spec.origin, _installation()):
        return (
            f"{name!r} is part of the Python installation (the standard library or an "
            "installed package), not imported"
        )
    return None


def check_importable(path: str, module_name: str) -> None:
    """Raises ValueError (one line: the import path, the module, the reason, the rule) unless
    importing ``module_name`` is allowed (see the module docstring); imports nothing."""
    parts = module_name.split(".")
    if "__main__" in parts and module_name not in sys.modules:
        main = ".".join(parts[: parts.index("__main__") + 1])
        raise ValueError(
            f"{quoted(path)}: {main!r} is a command line (a __main__ module), "
            f"which importing would run; {IMPORT_RULE}."
        )
    search_path = None
    for index in range(len(parts)):
        name = ".".join(parts[: index + 1])
        module = sys.modules.get(name)
        if module is not None:
            search_path = getattr(module, "__path__", None)
        else:
            try:
                spec = _find_spec(name, search_path)
            except (ImportError, ValueError):  # a finder's own refusal: not found
                spec = None
            if spec is None:
                raise ValueError(
                    f"Cannot import module {quoted(module_name)} for {quoted(path)}: no module "
                    f"named {quoted(name)}. Check the name and that its directory is on "
                    "PYTHONPATH (or is the working directory)."
                )
            reason = _refusal(path, name, spec)
            if reason is not None:
                raise ValueError(f"{quoted(path)}: {reason}; {IMPORT_RULE}.")
            search_path = spec.submodule_search_locations
        if index + 1 < len(parts) and search_path is None:
            raise ValueError(
                f"Cannot import module {quoted(module_name)} for {quoted(path)}: "
                f"{name!r} is not a package."
            )


def import_object(path: str):
    """``"package.module:Attr"`` or ``"package.module.Attr"`` -> the object. The module is
    imported only if a config may import it (``check_importable``)."""
    if not isinstance(path, str):
        raise ValueError(f"An import path is a string, got {type(path).__name__}.")
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    if (
        not attribute
        or not module_name
        or not all(part.isidentifier() for part in module_name.split("."))
    ):
        raise ValueError(f"{quoted(path)} is not an import path; write it as package.module:Name.")
    check_importable(path, module_name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(
            f"Cannot import module {quoted(module_name)} for {quoted(path)}: "
            f"{error}. Check the name and that its directory is on "
            "PYTHONPATH."
        ) from error
    obj = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ValueError(
                f"Module {quoted(module_name)} has no attribute "
                f"{quoted(attribute)} (from {quoted(path)})."
            )
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
        or callable(getattr(cls, "create_dataloader", None))
    )


def _is_data_processor(obj) -> bool:
    if isinstance(obj, type):
        return _builds_batches(obj)
    declared = _declared_return(obj)
    if _builds_batches(declared):
        return True
    origin = typing.get_origin(declared) or declared
    return origin in (collections.abc.Iterable, collections.abc.Iterator, collections.abc.Generator)


_KINDS = {
    "model": (
        _is_model,
        "a torch.nn.Module subclass",
        "a function declared to return one (`def build(...) -> MyModel`)",
    ),
    "data processor": (
        _is_data_processor,
        "a data processor (a class with create_dataloader(), or a DataLoader "
        "or IterableDataset subclass)",
        "a function declared to return one (`def data(...) -> torch.utils.data.DataLoader`)",
    ),
}


def _resolve(table, kind, name):
    if not isinstance(name, str) or not name:
        raise ValueError(f"Expected the {kind} name to be a non-empty string, got {quoted(name)}.")
    if name in table:
        return table[name]
    if ":" in name or "." in name:
        obj = import_object(name)
        accepts, what, function = _KINDS[kind]
        if not accepts(obj):
            raise ValueError(
                f"{quoted(name)} is not {what}, nor {function}; a config may only name those, so "
                f"that loading it cannot run other code. Name the right object, or register "
                f"it with @register_{kind.replace(' ', '_')}."
            )
        return obj
    known = ", ".join(sorted(table)) or "none registered"
    raise ValueError(
        f"Unknown {kind} {quoted(name)} (registered: {known}). Register it with "
        f"@register_{kind.replace(' ', '_')}({quoted(name)}) in a module the run imports, or give "
        "an import path such as my_package.models:MyModel."
    )


def get_model(name: str):
    return _resolve(_MODELS, "model", name)


def get_data_processor(name: str):
    return _resolve(_DATA_PROCESSORS, "data processor", name)


# ------------------------------------------------------------------ arguments by signature
def check_arguments(
    target, kwargs: dict, label: str, *, passed=(), ignore=(), also=(), required: bool = True
) -> None:
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
            raise ValueError(
                f"{shown(label)}: unknown argument{plural} "
                f"{', '.join(map(quoted, unknown[:5]))}; accepted: "
                f"{', '.join(accepted) or 'none'}"
            )
    if required:
        missing = [
            p.name
            for p in parameters
            if p.kind in named and p.default is inspect.Parameter.empty and p.name not in kwargs
        ]
        if missing:
            plural = "s" if len(missing) > 1 else ""
            raise ValueError(
                f"{shown(label)}: missing argument{plural} {', '.join(map(repr, missing))}"
            )
