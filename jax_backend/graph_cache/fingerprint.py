"""Fingerprints of the Python values a traced step depends on, for the graph cache's key.

A captured graph freezes everything the step body read: Python numbers, module attributes,
tensors that are not state, the code that ran. ``Fingerprinter`` walks the object graph
reachable from given roots (the step function, its arguments, the registered models and
optimizers) and hashes what can change the trace:

* plain values (numbers, strings, containers of them) by value;
* state tensors by their place in the state list (their values are inputs of the graph),
  other tensors by shape, dtype and the sha256 of their bytes (they become graph constants);
* functions by their code (bytecode, constants, names, nested code), defaults, closure
  cells and, for code outside the libraries, the module globals their code names and the
  attributes it names of modules among them (``config.lr``, ``getattr(config, "lr")``,
  ``F.gelu``: the object found there now, so a replaced library function is seen);
* objects by their type and their ``__dict__``/``__slots__``; classes defined outside the
  libraries by their methods (code and the globals those name).

Each ``add`` is one named part with a sha256 of its own (``parts``), so that a key can say
which part changed; an object met again is a reference to the part and place where it was
first described, so a part's digest changes with what it holds and not with how many
objects the parts before it held. ``add_function`` makes a user's function several parts:
each of its closure variables and each global its code names, then its code.

Anything it cannot describe deterministically (locks, files, started generators, JAX
arrays, fake tensors) raises ``NotCacheable``: a step whose key is in doubt is never cached.
Sets are hashed in a sorted order, so string hashing's per-process randomisation does not
matter, and hook tables by rank rather than by handle id. Values that differ from run to
run (an ``id()``, a time) make every run a miss, never a wrong hit.

Library functions (torch, jax, jaxlib, the standard library) are hashed with their closures
but their globals are not walked: the libraries' versions are part of the key. The same
holds for this project's code and packages under ``register_project_dir`` (their files are
covered by the cache's file list). Code without a file (``python -c``, notebook cells) is
user code. User code installed in a library module or a torch class at run time
(``torch.nn.functional.gelu = my_gelu``) is found by ``replaced_library_attributes``.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import inspect
import os
import re
import sys
import sysconfig
import types
import weakref

import jax
import numpy as np
import torch

from jax_backend import torch_versions
from jax_backend.errors import CstorchError

#: Directories whose code is identified by its name; their versions are in the key.
LIBRARY_DIRS = tuple(
    sorted(
        {
            os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
            os.path.dirname(os.path.abspath(jax.__file__)) + os.sep,
            os.path.dirname(os.path.abspath(str(__import__("jaxlib").__file__))) + os.sep,
            os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep,
            os.path.abspath(sysconfig.get_paths()["platstdlib"]) + os.sep,
        }
    )
)
# jax_backend/ (this file is jax_backend/graph_cache/fingerprint.py)
_PROJECT_DIRS = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep]

#: Bounds of one fingerprint: objects visited, bytes of tensor/array values hashed.
MAX_OBJECTS = 200_000
#: Environment variables the libraries set themselves the first time a step is traced (torch
#: 2.9 its inductor cache's location, JAX 0.7 its backend's log level and TPU metadata switch):
#: left out wherever the environment is fingerprinted (``os.environ`` read by a step, the
#: graph cache's process inputs), or a key taken after the first trace would differ from the
#: one taken before it. None changes what a step computes.
LIBRARY_SET_ENVIRONMENT = frozenset(
    {"TORCHINDUCTOR_CACHE_DIR", "TF_CPP_MIN_LOG_LEVEL", "TPU_SKIP_MDS_QUERY"}
)
MAX_VALUE_BYTES = 64 * 1024 * 1024

_ATOMS = (type(None), bool, int, float, complex, str, bytes)
_TORCH_ATOMS = (torch.dtype, torch.device, torch.layout, torch.memory_format)
# Iterators over built-in containers: ``__reduce__`` gives (iter, (container,), position).
_EMPTY_CONTAINERS: tuple = ([], (), range(0), "", b"", {}, {}.values(), {}.items(), set())
_BUILTIN_ITERATORS = tuple({type(iter(x)) for x in _EMPTY_CONTAINERS})
_DESCRIPTORS = (
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.MethodWrapperType,
)
_CLASS_SKIP = {"_abc_impl"}  # (dunder attributes other than methods are skipped too)


class NotCacheable(CstorchError):
    """The step depends on something the graph cache cannot fingerprint (the message says
    what and where); its graph is captured every time instead."""


def register_project_dir(path: str) -> None:
    """Marks a package directory whose code is hashed but whose globals are not walked."""
    path = os.path.abspath(path) + os.sep
    if path not in _PROJECT_DIRS:
        _PROJECT_DIRS.append(path)


def is_library_file(filename: str) -> bool:
    """Whether code from ``filename`` is library code (named, not hashed). Code without a
    file (``python -c``, notebooks' ``<ipython-input-...>``, ``exec``) is the user's, except
    the standard library's frozen modules."""
    if filename.startswith("<"):
        return filename.startswith("<frozen ")
    path = os.path.abspath(filename)
    return path.startswith(LIBRARY_DIRS) or path.startswith(torch_versions.generated_source_dirs())


def _is_real_file(filename: str) -> bool:
    return bool(filename) and not filename.startswith("<")


def _is_project_file(filename: str) -> bool:
    return _is_real_file(filename) and os.path.abspath(filename).startswith(tuple(_PROJECT_DIRS))


@functools.lru_cache(maxsize=4096)
def code_digest(code: types.CodeType) -> str:
    """sha256 of a code object: bytecode, constants (nested code recursively), names and
    arguments. Line numbers are left out: moving a function does not change what it does."""
    h = hashlib.sha256()
    for part in (
        code.co_name,
        code.co_qualname,
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        code.co_flags,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
    ):
        h.update(repr(part).encode())
    h.update(code.co_code)
    for const in code.co_consts:
        h.update(_const_text(const).encode())
    return h.hexdigest()


def _const_text(const) -> str:
    if isinstance(const, types.CodeType):
        return code_digest(const)
    if isinstance(const, frozenset):  # ``x in {"a", "b"}``: sorted, not in hash order
        return "frozenset:" + ",".join(sorted(_const_text(c) for c in const))
    if isinstance(const, tuple):
        return "tuple:(" + ",".join(_const_text(c) for c in const) + ")"
    return f"{type(const).__qualname__}:{const!r}"


def global_names(code: types.CodeType) -> list:
    """Every name a code object (and the code nested in it) may load from its globals."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += global_names(const)
    return list(dict.fromkeys(names))


def _attribute_names(code: types.CodeType) -> list:
    """The names a code object may read as attributes: ``co_names`` (``config.lr``) and the
    identifier-like string constants (``getattr(config, "lr")``), of nested code too."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _attribute_names(const)
        elif isinstance(const, str) and const.isidentifier():
            names.append(const)
    return list(dict.fromkeys(names))


@functools.lru_cache(maxsize=None)
def _is_named_file(filename: str) -> bool:
    """Library or project code: identified by name and version, never hashed."""
    return is_library_file(filename) or _is_project_file(filename)


def _foreign_code(value) -> bool:
    """Whether ``value`` is a user's function (or a user class's instance, or a partial or
    bound method of a user's function) rather than library or project code. A function made
    by ``exec`` (no source file) belongs to the module its globals name; libraries make such
    functions too (scipy, typing_inspection), some in a namespace naming no module at all,
    which we take for the library's (user code run by ``exec`` names ``__main__``)."""
    kind = type(value)
    if kind is types.FunctionType:
        filename = value.__code__.co_filename
        if not _is_real_file(filename):
            if value.__module__ is None:
                return False
            filename = _module_file(value.__module__) or filename
        return not _is_named_file(filename)
    if kind is types.MethodType:
        return _foreign_code(value.__func__)
    if kind is functools.partial:
        return _foreign_code(value.func)
    return _is_user_type(kind)  # type: ignore[arg-type]  # (a class is hashable)


@functools.lru_cache(maxsize=None)
def _is_user_type(cls) -> bool:
    if not _is_python_class(cls):
        return False
    filename = _module_file(cls.__module__)
    return filename is not None and not _is_named_file(filename)


#: Library classes whose methods scripts replace (``torch.Tensor.foo = ...``).
_PATCHED_CLASSES = ("torch.Tensor", "torch.nn.Module", "torch.nn.Parameter")


def replaced_library_attributes() -> dict:
    """``{"module.name": value}`` for every attribute of a loaded library module (and of a
    few torch classes) that holds user code: a library function replaced at run time
    (``torch.nn.functional.gelu = my_gelu``). Library code calls it by that name, so what it
    does must be in the key; a hit reached through code we do not walk would miss it.
    (Replacing a library function by another library function is seen only where user code
    names it.)"""
    found = {}
    for name, module in list(sys.modules.items()):
        filename = getattr(module, "__file__", None)
        if (
            not isinstance(module, types.ModuleType)
            or not isinstance(filename, str)
            or not is_library_file(filename)
        ):
            continue
        for attribute, value in list(vars(module).items()):
            if _foreign_code(value):
                found[f"{name}.{attribute}"] = value
    for qualified in _PATCHED_CLASSES:
        module_name, _, class_name = qualified.rpartition(".")
        cls = getattr(sys.modules.get(module_name), class_name, None)
        for attribute, value in list(vars(cls).items()) if isinstance(cls, type) else ():
            if _foreign_code(value) or (
                isinstance(value, (staticmethod, classmethod)) and _foreign_code(value.__func__)
            ):
                found[f"{qualified}.{attribute}"] = value
    return dict(sorted(found.items()))


def _module_file(module_name) -> str | None:
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    filename = getattr(module, "__file__", None)
    return (
        os.path.abspath(filename) if isinstance(filename, str) and _is_real_file(filename) else None
    )


class Fingerprinter:
    """Accumulates a sha256 over values (``add``), and one per part (``parts``: ``(label,
    digest)`` in the order added). ``state`` are the tensors whose values are graph inputs;
    ``hook(obj)`` may return a stand-in to describe instead of ``obj`` (the caller's way to
    name its own objects), or None. ``files`` collects the source files of the non-library
    code seen, for the cache's file check."""

    def __init__(self, state=(), hook=None, consumable=None):
        self._hash = hashlib.sha256()  # over every part
        self._part = hashlib.sha256()  # over the current part
        self._label = ""  # the current part's
        self._count = 0  # objects first seen in the current part
        self._state = state if isinstance(state, dict) else {id(t): i for i, t in enumerate(state)}
        self._hook = hook
        self._consumable = consumable or {}
        self.generators: dict = {}  # id -> (generator, digest) of unstarted generators seen
        self.consumed: list = []  # generators of ``consumable`` found exhausted
        self.parts: list = []  # (label, digest of that part alone) after each ``add``
        self._seen: dict = {}  # id -> (label of the part that described it, index there)
        self._keep: list = []  # every object seen: ids stay unique while we walk
        self._path: list = []
        self._value_bytes = 0
        self.files: set = set()

    @contextlib.contextmanager
    def _new_part(self, label: str):
        self._path, self._label, self._count = [label], label, 0
        self._part = hashlib.sha256()
        self._emit("root", label)
        try:
            yield
        except RecursionError:
            raise NotCacheable(f"objects nested too deeply under {label}") from None
        self.parts.append((label, self._part.hexdigest()))

    def add(self, label: str, value) -> None:
        """``value`` as the part ``label``."""
        with self._new_part(label):
            self._describe(value)

    def add_function(self, label: str, fn) -> None:
        """A user's function ``fn`` as several parts, so that a miss can say which changed:
        each closure variable (``<label>'s free variable NAME``) and each global its code
        names (``<label>'s global NAME``, with the attributes the code names of a module
        among them), then ``label`` itself: its code, defaults and source file. These are the
        values ``add`` walks inside the function. Anything else (library code, a method, a
        callable object, what the hook stands in for) is the one part ``label``."""
        if (
            type(fn) is not types.FunctionType
            or not _is_user_file(fn.__code__.co_filename)
            or (self._hook is not None and self._hook(fn) is not None)
        ):
            self.add(label, fn)
            return
        code = fn.__code__
        attribute_names = _attribute_names(code)
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            with self._new_part(f"{label}'s free variable {name}"):
                self._cell(name, cell, attribute_names)
        for name in _walked_globals(code, fn.__globals__):
            with self._new_part(f"{label}'s global {name}"):
                self._global(name, fn.__globals__[name], attribute_names)
        with self._new_part(label):
            if self._first_sight(fn):
                self._function(fn, split=True)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def release(self) -> None:
        """Drops the references kept while walking (call once no more ``add`` follows)."""
        self._keep.clear()
        self._seen.clear()

    # ------------------------------------------------------------------------------ helpers
    def _emit(self, *parts) -> None:
        for part in parts:
            text = part if isinstance(part, str) else repr(part)
            data = f"{len(text)}:{text};".encode()
            self._hash.update(data)
            self._part.update(data)

    def _fail(self, what: str):
        raise NotCacheable(f"{what} at {'.'.join(self._path)}")

    def _child(self, label, value) -> None:
        self._path.append(str(label))
        self._describe(value)
        self._path.pop()

    def _describe(self, value) -> None:
        if type(value) in _ATOMS:
            self._emit(type(value).__name__, value)
            return
        if isinstance(value, _TORCH_ATOMS):
            self._emit(type(value).__name__, str(value))
            return
        if not self._first_sight(value):
            return
        if self._hook is not None:
            stand_in = self._hook(value)
            if stand_in is not None:
                self._keep.append(stand_in)
                self._emit("as")
                self._describe(stand_in)
                return
        self._describe_object(value)

    def _first_sight(self, value) -> bool:
        """Whether ``value`` is seen for the first time (to be described now); if not, a
        reference to where it was described is emitted."""
        key = id(value)
        if key in self._seen:
            self._emit("ref", *self._seen[key])
            return False
        self._seen[key] = (self._label, self._count)
        self._count += 1
        self._keep.append(value)  # alive until the end, so no later object reuses its id
        if len(self._seen) > MAX_OBJECTS:
            self._fail(f"more than {MAX_OBJECTS} objects reachable")
        return True

    def _describe_object(self, value) -> None:  # noqa: C901 - one branch per kind of value
        if value is os.environ:
            self._emit("environ")
            self._mapping(
                {k: v for k, v in sorted(os.environ.items()) if k not in LIBRARY_SET_ENVIRONMENT}
            )
        elif isinstance(value, torch.Tensor):
            self._tensor(value)
        elif isinstance(value, jax.Array):
            self._fail("a JAX array (its value would be baked into the graph)")
        elif isinstance(value, (tuple, list)):
            self._emit(_type_name(type(value)), len(value))
            for i, item in enumerate(value):
                self._child(i, item)
        elif isinstance(value, (dict, types.MappingProxyType)):
            self._mapping(value)
        elif isinstance(value, (set, frozenset)):
            self._set(value)
        elif isinstance(value, enum.Enum):
            self._emit("enum", _type_name(type(value)), value.name)
        elif isinstance(value, types.FunctionType):
            self._function(value)
        elif isinstance(value, types.MethodType):
            self._emit("method")
            self._child("__func__", value.__func__)
            self._child("__self__", value.__self__)
        elif isinstance(value, types.BuiltinFunctionType):
            owner = value.__self__
            self._emit("builtin", getattr(value, "__module__", None) or "", value.__qualname__)
            if owner is not None and not isinstance(owner, types.ModuleType):
                self._child("__self__", owner)
        elif isinstance(value, functools.partial):
            self._emit("partial")
            self._child("func", value.func)
            self._child("args", value.args)
            self._child("keywords", value.keywords)
        elif isinstance(value, type):
            self._class(value)
        elif isinstance(value, types.ModuleType):
            self._emit("module", value.__name__)
            filename = getattr(value, "__file__", None)
            if (
                isinstance(filename, str)
                and _is_real_file(filename)
                and not is_library_file(filename)
            ):
                self.files.add(os.path.abspath(filename))
        elif isinstance(value, types.GeneratorType):
            self._generator(value)
        elif isinstance(value, _BUILTIN_ITERATORS):
            self._emit("iterator", _type_name(type(value)))
            self._child("reduced", value.__reduce__()[1:])
        elif isinstance(value, weakref.ref):
            self._emit("weakref")
            self._child("referent", value())
        elif isinstance(value, (staticmethod, classmethod)):
            self._emit(type(value).__name__)
            self._child("__func__", value.__func__)
        elif isinstance(value, property):
            self._emit("property")
            for name in ("fget", "fset", "fdel"):
                self._child(name, getattr(value, name))
        elif isinstance(value, np.ndarray):
            self._array_bytes("ndarray", str(value.dtype), value.shape, value)
        elif isinstance(value, np.generic):
            self._emit("numpy", str(value.dtype), repr(value.item()))
        elif isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            self._emit("op", str(value))
        elif isinstance(value, _DESCRIPTORS):
            owner = getattr(value, "__objclass__", None) or type(getattr(value, "__self__", None))
            self._emit("descriptor", type(value).__name__, _type_name(owner), value.__name__)
            if isinstance(value, types.MethodWrapperType):
                self._child("__self__", value.__self__)
        elif isinstance(value, re.Pattern):
            self._emit("pattern", value.pattern, value.flags)
        elif isinstance(value, (slice, range)):
            self._emit(type(value).__name__, value.start, value.stop, value.step)
        elif value is Ellipsis or value is NotImplemented:
            self._emit(repr(value))
        else:
            self._instance(value)

    def _generator(self, gen) -> None:
        """An unstarted generator is its code and arguments (described by a digest of their
        own). One that ``consumable`` knew unstarted and is now exhausted keeps that digest:
        consuming it (``list(all_params)`` in gigaGPT's step) is what a trace does, and the
        caller replays it (``consumed``) instead of tracing."""
        state = inspect.getgeneratorstate(gen)
        if state == inspect.GEN_CREATED:
            inner = Fingerprinter(self._state, self._hook)
            inner._path = self._path + ["<generator>"]
            inner._emit("generator", gen.__qualname__, code_digest(gen.gi_code))
            inner._child("locals", dict(gen.gi_frame.f_locals))
            self.files |= inner.files
            self.generators[id(gen)] = (gen, inner.hexdigest())
            self._emit("generator", self.generators[id(gen)][1])
        elif state == inspect.GEN_CLOSED and id(gen) in self._consumable:
            self._emit("generator", self._consumable[id(gen)][1])
            self.consumed.append(gen)
        else:
            self._fail(f"a generator that is {state.lower().replace('gen_', '')}")

    def _mapping(self, value) -> None:
        self._emit(_type_name(type(value)), len(value))
        factory = getattr(value, "default_factory", None)
        if factory is not None:
            self._child("default_factory", factory)
        for i, (k, v) in enumerate(list(value.items())):
            self._child(f"key{i}", k)
            self._child(k if isinstance(k, str) else f"[{i}]", v)

    def _set(self, value) -> None:
        items = []
        for item in value:
            if type(item) not in _ATOMS and not (
                isinstance(item, tuple) and all(type(x) in _ATOMS for x in item)
            ):
                self._fail(f"a set holding {type(item).__name__} (no stable order)")
            items.append(f"{type(item).__name__}:{item!r}")
        self._emit(_type_name(type(value)), *sorted(items))

    def _tensor(self, tensor) -> None:
        index = self._state.get(id(tensor))
        if index is not None:
            self._emit("state", index)
            return
        # Fake, lazy and other subclass tensors have no value here that we could hash.
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.is_meta:
            self._fail(f"a {type(tensor).__name__} that is not state")
        if tensor.layout != torch.strided:
            self._fail(f"a {tensor.layout} tensor")
        data = tensor.detach().cpu().contiguous().reshape(-1)
        self._array_bytes(
            type(tensor).__name__,
            str(tensor.dtype),
            tuple(tensor.shape),
            data.view(torch.uint8).numpy() if data.numel() else b"",
        )
        self._emit(tuple(tensor.stride()), tensor.requires_grad)

    def _array_bytes(self, kind, dtype, shape, data) -> None:
        buffer = memoryview(data if isinstance(data, bytes) else np.ascontiguousarray(data))  # type: ignore[arg-type]
        self._value_bytes += buffer.nbytes
        if self._value_bytes > MAX_VALUE_BYTES:
            self._fail(f"more than {MAX_VALUE_BYTES >> 20} MiB of tensor values to hash")
        if isinstance(data, np.ndarray) and data.dtype.hasobject:
            self._fail("an object array")
        self._emit(kind, dtype, tuple(shape), hashlib.sha256(buffer.cast("B")).hexdigest())

    def _function(self, fn, split: bool = False) -> None:
        """``fn``'s code, defaults and closure cells, and for user code the globals its code
        names; ``split``: the cells and globals are parts of their own (``add_function``)."""
        code = fn.__code__
        filename = code.co_filename
        self._emit("function", fn.__module__ or "", fn.__qualname__, code_digest(code))
        self._child("__defaults__", fn.__defaults__)
        self._child("__kwdefaults__", fn.__kwdefaults__)
        user_code = _is_user_file(filename)
        attribute_names = _attribute_names(code) if user_code else ()
        if split:
            self._emit("cells and globals are parts")
        else:
            for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
                self._cell(name, cell, attribute_names)
        if is_library_file(filename):
            wrapped = getattr(fn, "__wrapped__", None)
            if wrapped is not None:  # a library decorator around user code
                self._child("__wrapped__", wrapped)
            return
        if _is_real_file(filename):
            self.files.add(os.path.abspath(filename))
        if user_code and not split:
            for name in _walked_globals(code, fn.__globals__):
                self._global(name, fn.__globals__[name], attribute_names)

    def _cell(self, name, cell, attribute_names) -> None:
        """A closure variable; of user code (``attribute_names`` given), a module in it has
        the attributes the code names walked too (a function-local import)."""
        try:
            contents = cell.cell_contents
        except ValueError:  # not yet bound
            self._emit("empty cell", name)
            return
        self._child(name, contents)
        if attribute_names and isinstance(contents, types.ModuleType):
            self._module_attributes(name, contents, attribute_names, set())

    def _global(self, name, value, attribute_names) -> None:
        """A global user code names, and the attributes it names of a module there, through
        submodules: ``config.lr`` after ``import config`` (set at run time, not in any file),
        ``getattr(config, "lr")``, and ``F.gelu`` / ``torch.nn.functional.gelu`` as the object
        found there now (a library function replaced at run time)."""
        self._child(name, value)
        if isinstance(value, types.ModuleType):
            self._module_attributes(name, value, attribute_names, set())

    def _module_attributes(self, label, module, names, visited) -> None:
        if id(module) in visited or len(visited) > 64:
            return
        visited.add(id(module))
        attributes = vars(module)
        for attribute in names:
            if attribute in attributes and not attribute.startswith("__"):
                value = attributes[attribute]
                self._child(f"{label}.{attribute}", value)
                if isinstance(value, types.ModuleType):
                    self._module_attributes(f"{label}.{attribute}", value, names, visited)

    def _class(self, cls) -> None:
        self._emit("class", cls.__module__, cls.__qualname__)
        module = sys.modules.get(cls.__module__)
        filename = _module_file(cls.__module__)
        if (
            filename is None
            and module is not None
            and (cls.__module__ in sys.builtin_module_names or not _is_python_class(cls))
        ):
            return  # a built-in or C-extension class
        if filename is not None and (is_library_file(filename) or _is_project_file(filename)):
            return
        if filename is not None:
            self.files.add(filename)
        for base in cls.__bases__:
            self._child("base", base)
        for name, member in vars(cls).items():  # methods and class attributes
            dunder = name.startswith("__") and name.endswith("__")
            if name in _CLASS_SKIP or (dunder and not isinstance(member, types.FunctionType)):
                continue
            self._child(name, member)

    def _instance(self, value) -> None:
        cls = type(value)
        state = getattr(value, "__dict__", None)
        slots = [
            name
            for klass in cls.__mro__
            for name in getattr(klass, "__slots__", ())
            if isinstance(getattr(klass, "__slots__", ()), (tuple, list))
        ]
        if isinstance(getattr(cls, "__slots__", None), str):
            slots.append(cls.__slots__)
        if state is None and not slots:
            self._fail(f"a {_type_name(cls)} (no Python state to fingerprint)")
        if _has_native_state(value):
            self._fail(f"a {_type_name(cls)} (state held by C code)")
        self._emit("object")
        self._child("type", cls)
        if state is not None:
            self._child("__dict__", _hooks_by_rank(state))
        for name in slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                self._child(name, getattr(value, name))


def handle_ranks(ids) -> dict:
    """Each ``RemovableHandle`` id of ``ids`` -> its rank among them. Handle ids count every
    handle the process ever made, so the same hooks registered after another history get other
    ids and the same ranks: what the graph cache's fingerprint and the program signature
    (``cstorch/core/programs.py``) render."""
    return {h: i for i, h in enumerate(sorted(set(ids)))}


def _hooks_by_rank(state: dict) -> dict:
    """``state`` with its hook tables (``_forward_hooks``, ``_optimizer_step_pre_hooks``,
    ...: dicts keyed by ``RemovableHandle`` ids, which count every handle the process ever
    made) keyed by rank instead, so that the same hooks registered after a different history
    fingerprint alike."""
    tables = [
        name
        for name, value in state.items()
        if "hook" in name
        and isinstance(value, dict)
        and value
        and all(type(k) is int for k in value)
    ]
    if not tables:
        return state
    rank = handle_ranks(k for name in tables for k in state[name])
    shown = dict(state)
    for name in tables:
        shown[name] = ("hooks by rank", [(rank[k], v) for k, v in state[name].items()])
    return shown


def torch_global_hooks() -> dict:
    """torch's module hooks that apply to every module (``register_module_forward_hook``
    and relatives): they run during the trace like a module's own hooks."""
    from torch.nn.modules import module

    return _hooks_by_rank(
        {
            name: value
            for name, value in vars(module).items()
            if name.startswith("_global_") and isinstance(value, dict)
        }
    )


def _is_user_file(filename: str) -> bool:
    """Whether code from ``filename`` is the user's: neither library nor project code."""
    return not is_library_file(filename) and not _is_project_file(filename)


def _walked_globals(code, namespace) -> list:
    """The globals of ``namespace`` user code ``code`` names (dunder names left out)."""
    return [name for name in global_names(code) if name in namespace and not name.startswith("__")]


def _type_name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_python_class(cls) -> bool:
    """Whether ``cls`` was made by a class statement: a heap type (Py_TPFLAGS_HEAPTYPE) that
    is not immutable (Py_TPFLAGS_IMMUTABLETYPE). C extensions make immutable heap types (the
    standard library's ``_io`` from Python 3.12), whose state a ``__dict__`` does not hold."""
    return bool(cls.__flags__ & (1 << 9)) and not cls.__flags__ & (1 << 8)


def _has_native_state(value) -> bool:
    """True for instances of C types (locks, files, generators, ...) that also carry a
    ``__dict__``: the dict does not describe them."""
    return any(
        not _is_python_class(klass) and klass is not types.SimpleNamespace
        for klass in type(value).__mro__[:-1]
    )
