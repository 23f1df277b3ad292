"""State-dict structure: pytree flattening, dotted keys, and the protocol-1 treespec JSON.

A checkpoint stores its container structure as the string that ``torch.utils._pytree.treespec_dumps``
produced under torch 2.4 (protocol 1)::

    [1, {"type": "builtins.dict", "context": "[\\"model\\", 5]", "children_spec": [...]}]

Each node is ``{"type": <serialized type name or null>, "context": <dumped context>,
"children_spec": [...]}`` and a leaf is ``{"type": null, "context": null, "children_spec": []}``.

We flatten and serialize ourselves instead of calling torch's pytree because

* the format must stay the torch-2.4 one whatever torch we run on (torch 2.13 flattens
  ``torch.Size`` as a node, 2.4 cannot serialize it);
* cerebras-pytorch registers ``set`` as a container, and registering it globally from here
  would change every other pytree user in the process;
* ``treespec_loads`` imports modules named in the file (defaultdict factories, enum contexts),
  which a loader that must not run code from the file cannot allow.

Flattening follows torch 2.4 plus cstorch: exact ``dict``, ``OrderedDict``, ``defaultdict``,
``list``, ``tuple``, ``deque``, ``set`` and namedtuples are containers; ``None`` and everything
else is a leaf, except types the user registered with torch's pytree under a
``serialized_type_name`` (their flatten functions are used). ``torch.Size`` is kept as a leaf
(pickled whole) so that the reference, which cannot serialize it as a node, can read the file.

A leaf's key is its path joined by dots: ``str(key)`` for mapping keys, the position for
sequences, sets and namedtuples (the reference's ``recurse_spec`` rules).
"""

from __future__ import annotations

import importlib
import json
import sys
from collections import OrderedDict, defaultdict, deque, namedtuple
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.utils._pytree as _torch_pytree

from jax_backend.errors import CstorchError, quoted
from jax_backend.user_frames import warn

PROTOCOL = 1
LEAF_JSON = {"type": None, "context": None, "children_spec": []}

#: The reference wraps CSX-only deferred tensors in this namedtuple (``object``, ``metadata``).
NestedObject = namedtuple("NestedObject", ["object", "metadata"])

_SEQUENCE_TYPES = {list: "builtins.list", tuple: "builtins.tuple", set: "builtins.set"}
_MAPPING_TYPES = {dict: "builtins.dict", OrderedDict: "collections.OrderedDict"}
_OWN_TYPES = frozenset([dict, OrderedDict, defaultdict, list, tuple, deque, set, torch.Size])

# defaultdict factories we may resolve without importing anything.
_SAFE_FACTORIES = {
    ("builtins", name): getattr(__import__("builtins"), name)
    for name in (
        "list",
        "dict",
        "set",
        "frozenset",
        "tuple",
        "int",
        "float",
        "complex",
        "str",
        "bytes",
        "bool",
    )
}
_SAFE_FACTORIES.update(
    {
        ("collections", "OrderedDict"): OrderedDict,
        ("collections", "deque"): deque,
        ("collections", "defaultdict"): defaultdict,
    }
)


class TreeSpecError(CstorchError, ValueError):
    """The structure of a state dict cannot be written, or a stored structure cannot be read."""


@dataclass
class Node:
    """One pytree node: its serialized form plus what loading needs to rebuild it."""

    type_name: str | None
    context: Any  # the dumped context exactly as it sits in the JSON
    children: list[Node] = field(default_factory=list)
    child_keys: list[str] = field(default_factory=list)
    build: Callable[[list], Any] | None = None  # children values -> container (loading only)

    @property
    def is_leaf(self) -> bool:
        return self.type_name is None and not self.children

    def to_json(self) -> dict:
        if self.is_leaf:
            return dict(LEAF_JSON, children_spec=[])
        return {
            "type": self.type_name,
            "context": self.context,
            "children_spec": [c.to_json() for c in self.children],
        }

    def dumps(self) -> str:
        """The ``treespec_dumps`` string (protocol 1) of this structure."""
        return json.dumps([PROTOCOL, self.to_json()])

    def paths(self, prefix: tuple = ()) -> Iterator[tuple]:
        """Yields each leaf's path (a tuple of key strings), in leaf order."""
        if self.is_leaf:
            yield prefix
            return
        for key, child in zip(self.child_keys, self.children):
            yield from child.paths(prefix + (key,))

    def unflatten(self, leaves: Iterator) -> Any:
        """Rebuilds the container tree from an iterator over the leaves."""
        if self.is_leaf:
            return next(leaves)
        return self.build([child.unflatten(leaves) for child in self.children])


# --------------------------------------------------------------------------------------------
# Writing


@dataclass
class Flattened:
    leaves: list
    keys: list[str]
    spec: Node


def flatten(tree: Any) -> Flattened:
    """Flattens a state dict into leaves, their dotted keys and the structure."""
    leaves: list = []
    spec = _flatten(tree, (), leaves)
    keys = [".".join(p) for p in spec.paths()]
    seen: dict[str, int] = {}
    for index, key in enumerate(keys):
        if key in seen:
            raise TreeSpecError(
                f"Two entries of the state dict map to the same checkpoint key {key!r} "
                f"(leaves #{seen[key]} and #{index}). Keys are the dot-joined paths of the "
                "entries, so e.g. {'a.b': x} and {'a': {'b': y}} collide; rename one of them."
            )
        seen[key] = index
    return Flattened(leaves, keys, spec)


def leaf_spec_string(key: str) -> str:
    """``treespec_dumps`` of ``{key: <leaf>}``: the per-leaf spec every metadata entry carries."""
    return json.dumps(
        [
            PROTOCOL,
            {
                "type": "builtins.dict",
                "context": json.dumps([key]),
                "children_spec": [dict(LEAF_JSON, children_spec=[])],
            },
        ]
    )


def human_readable(tree: Any, spec: Node) -> Any:
    """The state dict with every leaf replaced by ``"*"``, or None when JSON cannot hold it."""
    stars = iter(["*"] * len(list(spec.paths())))
    try:
        value = _rebuild_for_display(tree, stars)
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value


def _rebuild_for_display(tree: Any, stars: Iterator) -> Any:
    node = _node_parts(tree, ())
    if node is None:
        return next(stars)
    type_name, _context, _keys, children, original_keys, _build = node
    values = [_rebuild_for_display(child, stars) for child in children]
    if original_keys is not None:
        return dict(zip(original_keys, values))
    if type_name == "builtins.set":
        return set(values)  # not JSON: the reference writes null for sets too
    return values


def _flatten(tree: Any, path: tuple, leaves: list) -> Node:
    parts = _node_parts(tree, path)
    if parts is None:
        leaves.append(tree)
        return Node(None, None)
    type_name, context, keys, children, _, build = parts
    return Node(
        type_name,
        context,
        [_flatten(child, path + (key,), leaves) for key, child in zip(keys, children)],
        keys,
        build,
    )


def _node_parts(tree: Any, path: tuple):
    """(type name, dumped context, child keys, children, mapping keys, rebuild) or None."""
    kind = type(tree)
    if kind in _MAPPING_TYPES:
        keys = list(tree.keys())
        _check_keys(keys, path)
        return (
            _MAPPING_TYPES[kind],
            json.dumps(keys),
            [str(k) for k in keys],
            list(tree.values()),
            keys,
            lambda values: kind(zip(keys, values)),
        )
    if kind is defaultdict:
        keys = list(tree.keys())
        _check_keys(keys, path)
        factory = tree.default_factory
        context = {
            "default_factory_module": getattr(factory, "__module__", None),
            "default_factory_name": getattr(factory, "__qualname__", None),
            "dict_context": keys,
        }
        return (
            "collections.defaultdict",
            context,
            [str(k) for k in keys],
            list(tree.values()),
            keys,
            lambda values: defaultdict(factory, zip(keys, values)),
        )
    if kind in _SEQUENCE_TYPES:
        children = list(tree)
        return (
            _SEQUENCE_TYPES[kind],
            "null",
            [str(i) for i in range(len(children))],
            children,
            None,
            kind,
        )
    if kind is deque:
        children = list(tree)
        return (
            "collections.deque",
            json.dumps(tree.maxlen),
            [str(i) for i in range(len(children))],
            children,
            None,
            lambda values: deque(values, maxlen=tree.maxlen),
        )
    if _torch_pytree.is_namedtuple_class(kind):
        children = list(tree)
        return (
            "collections.namedtuple",
            _namedtuple_name(kind),
            [str(i) for i in range(len(children))],
            children,
            None,
            lambda values: kind(*values),
        )
    if kind not in _OWN_TYPES:
        return _registered_node_parts(tree, kind)
    return None


def _registered_node_parts(tree: Any, kind: type):
    """A type the user registered with torch's pytree (and gave a serialized name)."""
    node_def = _torch_pytree.SUPPORTED_NODES.get(kind)
    serialize_def = getattr(_torch_pytree, "SUPPORTED_SERIALIZED_TYPES", {}).get(kind)
    no_name = getattr(_torch_pytree, "NO_SERIALIZED_TYPE_NAME_FOUND", None)
    if (
        node_def is None
        or serialize_def is None
        or serialize_def.serialized_type_name in (None, no_name)
    ):
        return None
    children, context = node_def.flatten_fn(tree)
    children = list(children)
    if serialize_def.to_dumpable_context is not None:
        dumped = serialize_def.to_dumpable_context(context)
    else:
        try:
            dumped = json.dumps(context)
        except TypeError as e:
            raise TreeSpecError(
                f"The pytree context of {kind.__qualname__} is not JSON serializable; register "
                "the type with to_dumpable_context/from_dumpable_context."
            ) from e
    return (
        serialize_def.serialized_type_name,
        dumped,
        _context_keys(context, len(children)),
        children,
        None,
        lambda values: node_def.unflatten_fn(values, context),
    )


def _context_keys(context: Any, count: int) -> list[str]:
    # The reference names children by their context entries when the context is a sequence.
    if isinstance(context, (list, tuple)) and len(context) == count:
        return [str(k) for k in context]
    return [str(i) for i in range(count)]


def _check_keys(keys: list, path: tuple) -> None:
    for key in keys:
        if key is not None and not isinstance(key, (str, int, float)):
            where = ".".join(path) or "<root>"
            raise TreeSpecError(
                f"Dict key {key!r} (type {type(key).__name__}) at {where!r} cannot be stored in a "
                "checkpoint: the format keeps dict keys as JSON, so they must be str, int, float, "
                "bool or None. Convert the key (e.g. to a string) before saving."
            )


def _namedtuple_name(cls: type) -> str:
    serialize_def = getattr(_torch_pytree, "SUPPORTED_SERIALIZED_TYPES", {}).get(cls)
    no_name = getattr(_torch_pytree, "NO_SERIALIZED_TYPE_NAME_FOUND", None)
    if serialize_def is not None and serialize_def.serialized_type_name not in (None, no_name):
        return serialize_def.serialized_type_name
    # torch would refuse an unregistered namedtuple; its import path is the natural name.
    return f"{cls.__module__}.{cls.__qualname__}"


# --------------------------------------------------------------------------------------------
# Reading


def loads(spec: str, *, allow_imports: bool = False) -> Node:
    """Parses a ``treespec_dumps`` string. Imports modules only when ``allow_imports``."""
    try:
        protocol, root = json.loads(spec)
    except (TypeError, ValueError) as e:
        raise TreeSpecError(
            f"the stored treespec is not protocol-1 JSON: {str(spec)[:200]!r}"
        ) from e
    if protocol != PROTOCOL:
        raise TreeSpecError(
            f"unsupported treespec protocol {quoted(protocol)} (only {PROTOCOL} is known)"
        )
    return _parse(root, allow_imports)


def _parse(obj: dict, allow_imports: bool) -> Node:
    try:
        type_name, context, children = obj["type"], obj["context"], obj["children_spec"]
    except (TypeError, KeyError) as e:
        raise TreeSpecError(f"malformed treespec node: {str(obj)[:200]!r}") from e
    if type_name is None:
        if context is not None or children:
            raise TreeSpecError(f"malformed treespec leaf: {str(obj)[:200]!r}")
        return Node(None, None)
    nodes = [_parse(child, allow_imports) for child in children]
    count = len(nodes)
    indices = [str(i) for i in range(count)]
    node = Node(type_name, context, nodes, indices)

    if type_name in ("builtins.dict", "collections.OrderedDict"):
        keys = _json_list(context, type_name, count)
        node.child_keys = [str(k) for k in keys]
        kind = dict if type_name == "builtins.dict" else OrderedDict
        node.build = lambda values, kind=kind, keys=keys: kind(zip(keys, values))
    elif type_name == "collections.defaultdict":
        if not isinstance(context, dict) or "dict_context" not in context:
            raise TreeSpecError(f"malformed defaultdict context {quoted(context)}")
        keys = list(context["dict_context"])
        factory = _resolve_factory(context, allow_imports)
        node.child_keys = [str(k) for k in keys]
        node.build = lambda values, keys=keys, factory=factory: defaultdict(
            factory, zip(keys, values)
        )
    elif type_name == "builtins.list":
        node.build = list
    elif type_name in ("builtins.tuple", "torch.Size"):
        node.build = tuple if type_name == "builtins.tuple" else torch.Size
    elif type_name == "builtins.set":
        node.build = set
    elif type_name == "collections.deque":
        maxlen = json.loads(context) if isinstance(context, str) else context
        node.build = lambda values, maxlen=maxlen: deque(values, maxlen=maxlen)
    elif type_name == "collections.namedtuple":
        cls = _resolve_namedtuple(context, allow_imports)
        node.build = (lambda values, cls=cls: cls(*values)) if cls is not None else tuple
    else:
        _parse_registered(node, allow_imports)
    return node


def _json_list(context: Any, type_name: str, count: int) -> list:
    try:
        keys = json.loads(context) if isinstance(context, str) else context
    except ValueError as e:
        raise TreeSpecError(f"malformed {quoted(type_name)} context {quoted(context)}") from e
    if not isinstance(keys, list) or len(keys) != count:
        raise TreeSpecError(
            f"{quoted(type_name)} context {quoted(context)} does not list {count} keys"
        )
    return keys


def _parse_registered(node: Node, allow_imports: bool) -> None:
    """A node type registered with torch's pytree by code running in this process."""
    kind = getattr(_torch_pytree, "SERIALIZED_TYPE_TO_PYTHON_TYPE", {}).get(node.type_name)
    node_def = _torch_pytree.SUPPORTED_NODES.get(kind) if kind is not None else None
    if node_def is None:
        raise TreeSpecError(
            f"The checkpoint contains a container of type {quoted(node.type_name)}, which is not "
            "registered in this process. Import the module that registers it with "
            "torch.utils._pytree (serialized_type_name=...) before loading."
        )
    serialize_def = _torch_pytree.SUPPORTED_SERIALIZED_TYPES[kind]
    if serialize_def.from_dumpable_context is not None:
        context = serialize_def.from_dumpable_context(node.context)
    else:
        context = json.loads(node.context)
    node.child_keys = _context_keys(context, len(node.children))
    node.build = lambda values, fn=node_def.unflatten_fn, context=context: fn(values, context)


def _resolve_factory(context: dict, allow_imports: bool):
    module, name = context.get("default_factory_module"), context.get("default_factory_name")
    if module is None and name is None:
        return None
    if (module, name) in _SAFE_FACTORIES:
        return _SAFE_FACTORIES[(module, name)]
    if not allow_imports:
        # Any importable callable could be named here (e.g. posix.abort), and it runs on the
        # first missing key: only trusted files may name one.
        raise TreeSpecError(
            f"The checkpoint names {quoted(f'{module}.{name}')} as a defaultdict factory; only "
            "builtins and "
            "collections types are accepted from untrusted files. If you trust this file, "
            "load it with cstorch.load(path, unsafe_allow_pickle=True)."
        )
    found = _lookup(module, name, allow_imports)
    if found is None:
        warn(
            f"defaultdict factory {quoted(f'{module}.{name}')} is not a builtin and its module is "
            "not imported; "
            "the defaultdict is restored without a default factory. Import the module first, or "
            "pass unsafe_allow_pickle=True to let the loader import it."
        )
    return found


def _resolve_namedtuple(name: str, allow_imports: bool):
    if name == "NestedObject":
        return NestedObject
    registered = getattr(_torch_pytree, "SERIALIZED_TYPE_TO_PYTHON_TYPE", {}).get(name)
    if registered is not None:
        return registered
    module, _, qualname = str(name).rpartition(".")
    cls = _lookup(module, qualname, allow_imports) if module else None
    if cls is not None and _torch_pytree.is_namedtuple_class(cls):
        return cls
    warn(
        f"namedtuple type {quoted(name)} is neither registered with torch.utils._pytree nor defined in "
        "an imported module; it is restored as a plain tuple. Import its module before loading, "
        "or pass unsafe_allow_pickle=True to let the loader import it."
    )
    return None


def _lookup(module: str | None, qualname: str | None, allow_imports: bool):
    """Finds ``module.qualname`` among imported modules (importing only when allowed)."""
    if not module or not qualname:
        return None
    mod = sys.modules.get(module)
    if mod is None and allow_imports:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            return None
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj
