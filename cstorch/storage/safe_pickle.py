"""Pickled leaves (``ObjectSerializer``): writing them, and reading them without running code.

The reference pickles any leaf that is not a tensor, array, scalar, string or None with
``dill``. We pickle with ``dill`` too when it is importable (so files match the reference byte
for byte in the common case) and with the standard ``pickle`` otherwise; dill reads standard
pickles, so the reference loads either. The one difference: without dill, objects that only
dill can pickle (lambdas, classes defined in ``__main__`` by value) cannot be saved.

Unpickling runs whatever callables the stream names, so a checkpoint from an untrusted source
could execute code. :func:`loads` therefore uses an unpickler that resolves only an allow-list
of data types -- builtins, ``collections`` containers, torch dtypes/devices/Size, and numpy
arrays, dtypes and scalars (plus the few ``dill._dill`` helpers that dill uses for those) --
and raises :class:`UnsafePickleError` naming the refused global otherwise. The caller opts out
with ``unsafe_allow_pickle=True`` (``cstorch.load(path, unsafe_allow_pickle=True)``), which
unpickles with dill (or pickle) unrestricted.
"""

from __future__ import annotations

import _compat_pickle
import builtins
import collections
import io
import pickle
import re

import numpy as np
import torch

from jax_backend.errors import CstorchError, quoted

try:  # dill is what the reference uses; it is optional here.
    import dill as _dill
except ImportError:  # pragma: no cover - depends on the environment
    _dill = None

OPT_IN = "unsafe_allow_pickle=True"


class UnsafePickleError(CstorchError, pickle.UnpicklingError):
    """A pickled value in a checkpoint names a Python global outside the safe allow-list.

    Unpickling it could run arbitrary code. If the checkpoint comes from a source you trust,
    load it with ``cstorch.load(path, unsafe_allow_pickle=True)``.
    """


def dumps(obj) -> bytes:
    """Pickles a leaf the way the reference does (dill when available)."""
    if _dill is not None:
        return _dill.dumps(obj)
    return pickle.dumps(obj, protocol=4)


def loads(data: bytes, *, what: str, unsafe_allow_pickle: bool = False, legacy_spec: bool = False):
    """Unpickles ``data``; ``what`` names the value in error messages (path and key).

    With ``legacy_spec`` the allow-list also admits the pytree ``TreeSpec``/``LeafSpec`` classes
    of old checkpoints, mapped to inert stand-ins (see :class:`LegacyTreeSpec`).
    """
    if unsafe_allow_pickle and _dill is not None and not legacy_spec:
        return _dill.loads(data)
    # Without dill, the allow-list's stand-ins for dill's helpers still read dill streams; in
    # permissive mode every other global is resolved normally.
    return _RestrictedUnpickler(
        io.BytesIO(data), what, legacy_spec, permissive=unsafe_allow_pickle
    ).load()


# --------------------------------------------------------------------------------------------
# The allow-list

_BUILTINS = frozenset(
    {
        "int",
        "float",
        "complex",
        "bool",
        "str",
        "bytes",
        "bytearray",
        "tuple",
        "list",
        "dict",
        "set",
        "frozenset",
        "slice",
        "range",
        "NoneType",
        "Ellipsis",
        "NotImplemented",
    }
)
_COLLECTIONS = {
    "OrderedDict": collections.OrderedDict,
    "defaultdict": collections.defaultdict,
    "deque": collections.deque,
    "Counter": collections.Counter,
}
_TORCH_CLASSES = {"Size": torch.Size, "device": torch.device}
# dill names builtin types through ``dill._dill._load_type``: current and py2-era names.
_DILL_TYPE_NAMES = {
    **{name: getattr(builtins, name) for name in _BUILTINS if hasattr(builtins, name)},
    "NoneType": type(None),
    "ComplexType": complex,
    "SliceType": slice,
    "IntType": int,
    "FloatType": float,
    "BooleanType": bool,
    "StringType": str,
    "UnicodeType": str,
    "BytesType": bytes,
    "ByteArrayType": bytearray,
    "TupleType": tuple,
    "ListType": list,
    "DictType": dict,
    "SetType": set,
    "FrozenSetType": frozenset,
    "XRangeType": range,
    "RangeType": range,
    "EllipsisType": type(Ellipsis),
}
_RANGE_REPR = re.compile(r"range\((-?\d+), (-?\d+)(?:, (-?\d+))?\)\Z")
_NUMPY_MODULES = ("numpy.core.multiarray", "numpy._core.multiarray")


def _dill_load_type(name):
    try:
        return _DILL_TYPE_NAMES[name]
    except KeyError:
        raise UnsafePickleError(
            f"dill type {quoted(name)} is not on the safe allow-list; pass {OPT_IN} to load it"
        ) from None


def _dill_eval_repr(text):
    # dill pickles ``range`` objects as their repr; accept exactly that shape, nothing else.
    match = _RANGE_REPR.match(str(text))
    if match is None:
        raise UnsafePickleError(
            f"refusing to evaluate {str(text)[:80]!r} from a dill pickle; pass {OPT_IN} to allow it"
        )
    return range(*(int(g) for g in match.groups() if g is not None))


def _dill_create_array(f, args, state, npdict=None):
    if f not in _numpy_reconstructors():
        raise UnsafePickleError("dill array constructor is not numpy's _reconstruct")
    if npdict:
        raise UnsafePickleError(f"refusing numpy array subclass state; pass {OPT_IN} to allow it")
    array = f(*args)
    array.__setstate__(state)
    return array


def _numpy_reconstructors():
    found = []
    for module in _NUMPY_MODULES:
        try:
            found.append(__import__(module, fromlist=["_reconstruct"])._reconstruct)
        except (ImportError, AttributeError):
            continue
    return found


_DILL_HELPERS = {
    "_load_type": _dill_load_type,
    "_eval_repr": _dill_eval_repr,
    "_create_array": _dill_create_array,
}


class LegacyTreeSpec:
    """Inert stand-in for a pickled ``torch.utils._pytree.TreeSpec`` of an old checkpoint.

    Only the attributes ``type``, ``context`` and ``children_specs`` are kept; they are read by
    :mod:`cstorch.storage.legacy`.
    """

    is_leaf_spec = False

    def __init__(self, type=None, context=None, children_specs=None, *_):
        self.type, self.context, self.children_specs = type, context, list(children_specs or [])

    def __setstate__(self, state):
        if isinstance(state, tuple):  # (dict_state, slots_state)
            state = {**(state[0] or {}), **(state[1] or {})}
        self.type = state.get("type")
        self.context = state.get("context")
        self.children_specs = list(state.get("children_specs") or [])


class LegacyLeafSpec(LegacyTreeSpec):
    is_leaf_spec = True


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, what: str, legacy_spec: bool, permissive: bool = False):
        super().__init__(file)
        self._what = what
        self._legacy_spec = legacy_spec
        self._permissive = permissive

    def find_class(self, module, name):
        # Protocols 0-2 may spell Python 2 names (``__builtin__.dict``); map them like pickle does.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        found = self._allowed(module, name)
        if found is None and self._permissive:
            return super().find_class(module, name)
        if found is None:
            raise UnsafePickleError(
                f"Refusing to unpickle the global {quoted(f'{module}.{name}')} in {self._what}: it "
                "is not on "
                "the allow-list of plain data types, and unpickling arbitrary classes can execute "
                f"code from the file. If you trust this checkpoint, pass {OPT_IN} to "
                "cstorch.load (or --unsafe-allow-pickle to the CLI)."
            )
        return found

    def _allowed(self, module, name):
        if module == "builtins" and name in _BUILTINS:
            return getattr(builtins, name, None) or _DILL_TYPE_NAMES.get(name)
        if module == "collections" and name in _COLLECTIONS:
            return _COLLECTIONS[name]
        if module == "_codecs" and name == "encode":  # protocol <= 2 spells bytes this way
            import _codecs

            return _codecs.encode
        if module == "torch":
            if name in _TORCH_CLASSES:
                return _TORCH_CLASSES[name]
            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
            return None
        if module == "numpy":
            if name in ("dtype", "ndarray"):
                return getattr(np, name)
            return None
        if module == "numpy.dtypes":
            value = getattr(np.dtypes, name, None)
            return value if isinstance(value, type) and issubclass(value, np.dtype) else None
        if module in _NUMPY_MODULES and name in ("_reconstruct", "scalar"):
            return getattr(__import__(module, fromlist=[name]), name)
        if module == "dill._dill" and name in _DILL_HELPERS:
            return _DILL_HELPERS[name]
        if self._legacy_spec and module == "torch.utils._pytree":
            return {"TreeSpec": LegacyTreeSpec, "LeafSpec": LegacyLeafSpec}.get(name)
        return None
