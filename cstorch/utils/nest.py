"""Walking nested structures (dicts, lists, tuples and registered types) of tensors.

``recurse_spec`` yields the key path of every leaf of a pytree spec in flattening order; the
checkpoint format names its datasets by these paths joined with dots.
"""

from __future__ import annotations

import inspect
import warnings
from collections import UserDict
from typing import Any, Callable, Generator, List, Optional, Tuple

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from jax_backend.errors import CstorchTypeError, CstorchValueError
from jax_backend.torch_versions import treespec_children

Scope = List[str]
_visit_fns: dict = {}  # tuple of types -> fn(struct) yielding ([key], child)


def register_visit_fn(*types):
    """A decorator registering ``fn(struct)`` — yielding ``([key], child)`` pairs — as the way
    to walk instances of ``types``."""
    for t in types:
        if not inspect.isclass(t):
            raise CstorchTypeError(f"Expected a type, got {t!r}.")

    def decorator(fn):
        key = tuple(types)
        if key in _visit_fns and _visit_fns[key] is not fn:
            warnings.warn(f"Replacing the visit function registered for {key}.", stacklevel=2)
        _visit_fns[key] = fn
        return fn

    return decorator


def unregister_visit_fn(*types) -> None:
    """Removes the visit function registered for exactly ``types``."""
    _visit_fns.pop(tuple(types), None)


def _find_visit_fn(struct):
    for types, fn in _visit_fns.items():
        if isinstance(struct, types):
            return fn
    return None


@register_visit_fn(dict, UserDict)
def _visit_dict(struct):
    for key, value in struct.items():
        yield [str(key)], value


@register_visit_fn(list, tuple)
def _visit_sequence(struct):
    for i, value in enumerate(struct):
        yield [str(i)], value


def visit_structure(
    data_structure,
    select_fn: Callable[[Any], bool],
    strict: bool = False,
    scope: Optional[Scope] = None,
) -> Generator[Tuple[Scope, Any], None, None]:
    """Yields ``(scope, item)`` for every item ``select_fn`` accepts; with ``strict``, an item
    that is neither a known container nor selected raises ValueError."""
    scope = scope or []
    visit = _find_visit_fn(data_structure)
    if visit is not None:
        for pair in visit(data_structure):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise CstorchTypeError(
                    f"A visit function must yield (scope, value) pairs, got {pair!r}."
                )
            keys, value = pair
            yield from visit_structure(value, select_fn, strict, scope + list(keys))
    elif select_fn(data_structure):
        yield scope, data_structure
    elif strict:
        raise CstorchValueError(f"Unknown data structure: {data_structure!r}")


def visit_torch_tensors(data_structure, strict: bool = False, scope: Optional[Scope] = None):
    """Yields ``(scope, tensor)`` for every torch tensor in the structure."""
    yield from visit_structure(data_structure, lambda x: isinstance(x, torch.Tensor), strict, scope)


def visit_device_tensors(
    data_structure, device_type: str, strict: bool = False, scope: Optional[Scope] = None
):
    """Yields ``(scope, tensor)`` for every tensor on a device of ``device_type``."""
    for keys, tensor in visit_torch_tensors(data_structure, strict, scope):
        if tensor.device.type == device_type:
            yield keys, tensor


def visit_lazy_tensors(data_structure, strict: bool = False, scope: Optional[Scope] = None):
    """Yields ``(scope, tensor)`` for every tensor whose value is still on the device."""
    from jax_backend import LazyTensor

    yield from visit_structure(data_structure, lambda x: isinstance(x, LazyTensor), strict, scope)


def recurse_spec(spec: TreeSpec, scope: Optional[Scope] = None):
    """Yields the key path (a list of strings) of each leaf of ``spec``, in leaf order: dict
    keys, sequence indices, namedtuple field positions."""
    if spec.num_leaves == 0:
        return
    scope = scope or []
    children = treespec_children(spec)
    if not children:
        yield scope
        return
    context = spec.context
    if isinstance(context, (list, tuple)) and len(context) == len(children):
        keys = context
    else:  # sequences, and namedtuples (whose context is the class)
        keys = range(len(children))
    for key, child in zip(keys, children):
        yield from recurse_spec(child, scope + [str(key)])


def map_structure(
    map_fn: Callable,
    data_structure,
    select_fn: Callable[[Any], bool],
    scope: Optional[Scope] = None,
):
    """The structure with every selected leaf ``x`` replaced by ``map_fn(scope, x)``."""
    leaves, spec = tree_flatten(data_structure)
    leaves = [
        map_fn(keys, leaf) if select_fn(leaf) else leaf
        for keys, leaf in zip(recurse_spec(spec, scope), leaves)
    ]
    return tree_unflatten(leaves, spec)


def map_torch_tensors(map_fn: Callable, data_structure, scope: Optional[Scope] = None):
    """The structure with every tensor ``t`` replaced by ``map_fn(scope, t)``."""
    return map_structure(map_fn, data_structure, lambda x: isinstance(x, torch.Tensor), scope)


def diff(data_structure_1, data_structure_2) -> Generator[str, None, None]:
    """Yields a message for each difference: keys present in only one structure, then
    values that differ (compared with ``!=``; tensors with ``torch.equal``)."""

    def flat(structure):
        leaves, spec = tree_flatten(structure)
        return {".".join(keys): leaf for keys, leaf in zip(recurse_spec(spec), leaves)}

    first, second = flat(data_structure_1), flat(data_structure_2)
    if set(first) != set(second):
        yield (
            f"Data structures have differing keys.\nKeys only in data structure 1: "
            f"{sorted(set(first) - set(second))}\nKeys only in data structure 2: "
            f"{sorted(set(second) - set(first))}\n"
        )
    for key, value in first.items():
        if key not in second:
            continue
        other = second[key]
        if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor):
            same = (
                value.shape == other.shape
                and value.dtype == other.dtype
                and bool(torch.equal(value, other))
            )
        else:
            same = not bool(value != other)
        if not same:
            yield f"Found mismatching values for {key}: {value} != {other}"
