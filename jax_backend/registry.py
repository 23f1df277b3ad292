"""The table of ATen lowerings: one dict from ``OpOverload`` to a small JAX function.

Lowerings are registered per explicit overload with ``@lowers(aten.add.Tensor, ...)`` in the
family modules under ``jax_backend/ops``. A lowering takes the node's arguments with tensors
replaced by JAX arrays and returns JAX arrays (a tuple for multi-output ops). Random ops are
registered with ``random=True`` and receive a fresh PRNG key as the keyword ``key``.
Matrix products registered with ``transposed_operands=(i, j)`` receive an operand at those
argument positions that a transpose of its last two dims produced as a ``TransposedOperand``
(see there).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from jax_backend.errors import DuplicateLoweringError, LoweringNotFoundError


@dataclasses.dataclass(frozen=True)
class Lowering:
    fn: Callable
    random: bool = False
    transposed_operands: tuple = ()


@dataclasses.dataclass(frozen=True)
class TransposedOperand:
    """An operand whose graph node swaps the last two dims of ``source`` (``flipped``; an even
    chain of such transposes gives ``source`` itself, not flipped); ``value`` is that node's
    own result. A matrix product may use ``source`` with its dimension numbers adjusted
    instead of ``value``: XLA's CPU compiler sees a transposed operand as a column-major
    array and computes a half-precision dot on it in float32, at half the speed
    (``ops.linalg``). Either way the same products, accumulated in float32."""

    value: object
    source: object
    flipped: bool


_LOWERINGS: dict = {}
#: Ops that write lists of tensors in place: ``{op: (functional op, written list positions)}``.
_LIST_WRITES: dict = {}


def lowers(*overloads, random: bool = False, transposed_operands: tuple = ()):
    """Registers the decorated function as the lowering of each given ATen overload."""

    def register(fn):
        for op in overloads:
            if op in _LOWERINGS:
                raise DuplicateLoweringError(
                    f"{op} already lowered by {_LOWERINGS[op].fn.__module__}."
                    f"{_LOWERINGS[op].fn.__name__}; remove one of the registrations."
                )
            _LOWERINGS[op] = Lowering(fn, random, transposed_operands)
        return fn

    return register


def writes_lists(op, functional, positions: tuple) -> None:
    """Registers ``op`` as writing, in place, the tensors of its list arguments at
    ``positions``: the values that ``functional`` (a lowered op of the same arguments)
    returns, in that order. The capture records such an op as one node and turns it into
    ``functional`` and a ``copy_`` per written tensor, which is what tracing those copies one
    by one would have recorded, without their tracing cost."""
    _LIST_WRITES[op] = (functional, tuple(positions))


def list_writes(op):
    """``(functional op, written list positions)`` of an op registered by ``writes_lists``,
    else None."""
    return _LIST_WRITES.get(op)


def lookup(op) -> Lowering:
    try:
        return _LOWERINGS[op]
    except KeyError:
        raise LoweringNotFoundError(op) from None


def has_lowering(op) -> bool:
    return op in _LOWERINGS


def lowered_namespaces() -> frozenset:
    """The op namespaces (``aten``, ``cstorch``, ...) that have at least one lowering."""
    return frozenset(op.namespace for op in _LOWERINGS if hasattr(op, "namespace"))
