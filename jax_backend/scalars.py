"""Python numbers as runtime inputs of a captured step: a torch optimizer's ``lr``, ``betas``,
``weight_decay``... read at every call instead of frozen into the graph.

A ``ScalarSlot`` names a place that holds a Python float the step reads (``group["lr"]``,
element 0 of ``group["betas"]``). While the step is traced, each slot holds a symbolic float
(torch's ``SymFloat``, from a ``ShapeEnv`` of the capture's own): the arithmetic torch does on
it in Python (``1 - beta1``, ``-lr``) is recorded as graph nodes (``operator.sub``, ...), and
ops that take it as a scalar argument take that node. The graph's placeholders after the
tensor inputs are the scalars it reads; its program takes their values as Python floats,
which ``jax.jit`` traces as weakly typed scalars (one program for every value), and which
the lowerings promote as torch promotes a Python number (``dtypes.result_type``).

Python control flow on a symbolic float (``if weight_decay != 0:``) leaves a *guard* in the
shape environment: the graph holds only for values that pass it. ``guards_by_slot`` sorts
them: a guard decided by the sign of one scalar (``!= 0``, ``> 0``) makes the program
select on that scalar's sign; any other (``== 0.9``: torch's fake tensors read the value when
they fold constants) on its exact value. The caller keys programs accordingly
(``condition``), or traces again with such a scalar as a plain constant.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import MutableMapping

import torch

#: What a scalar's program depends on: "sign" (-1, 0 or 1), "value" (the exact value).
SIGN, VALUE = "sign", "value"


@dataclasses.dataclass(frozen=True)
class ScalarSlot:
    """A Python float a step reads: ``container[key]``, or element ``index`` of the tuple
    held there (``betas``)."""

    container: MutableMapping
    key: object
    index: int | None = None
    name: str = dataclasses.field(default="", compare=False)  # for messages

    def get(self):
        value = self.container[self.key]
        return value if self.index is None else value[self.index]

    def set(self, value) -> None:
        if self.index is None:
            self.container[self.key] = value
            return
        held = self.container[self.key]
        items = list(held)
        items[self.index] = value
        self.container[self.key] = type(held)(items) if isinstance(held, tuple) else items


@dataclasses.dataclass(frozen=True)
class ScalarMeta:
    """``node.meta["val"]`` of a graph node that is a Python number (a scalar placeholder or
    arithmetic on one), once the trace is over (the trace's ``SymFloat`` refers to its shape
    environment, which is not kept)."""

    kind: str = "float"  # "float", "int" or "bool"


def is_runtime_scalar(value) -> bool:
    """Whether a value held in a scalar slot can be a runtime input: a float (not a bool, an
    int or a tensor, which select programs or are state)."""
    return isinstance(value, float)


def sign(value: float) -> int:
    return (value > 0) - (value < 0)


def condition(kind: str, value: float):
    """What a program that depends on ``kind`` of a scalar holding ``value`` was traced for:
    comparable with the same of the value at a later call."""
    return sign(value) if kind == SIGN else value


def is_symbolic(value) -> bool:
    return isinstance(value, (torch.SymFloat, torch.SymInt, torch.SymBool))


class Symbols:
    """Symbolic floats standing for the values of some scalar slots during one trace."""

    def __init__(self, values: list):
        # torch's symbolic shapes: the trace imports them anyway (torch.optim's compiler
        # checks load torch._dynamo), so this costs no import of its own.
        from torch._dynamo.source import ConstantSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

        self.env = ShapeEnv()
        self.values = []
        self._index = {}  # sympy symbol -> position in ``values``
        for i, value in enumerate(values):
            source = ConstantSource(f"cstorch_scalar_{i}")
            symbol = self.env.create_unspecified_symbol(
                float(value), source=source, dynamic_dim=DimDynamic.DYNAMIC
            )
            self.values.append(
                self.env.create_symfloatnode(symbol, hint=float(value), source=source)
            )
            self._index[symbol] = i

    def guards_by_slot(self) -> dict:
        """``{position: SIGN or VALUE}``: what of each scalar's value the traced graph
        depends on (module docstring); positions not listed: nothing."""
        kinds: dict = {}
        for guard in self.env.guards:
            expr = guard.expr
            symbols = [self._index[s] for s in expr.free_symbols if s in self._index]
            kind = SIGN if len(symbols) == 1 and _decided_by_sign(expr) else VALUE
            for i in symbols:
                if kinds.get(i) != VALUE:
                    kinds[i] = kind
        return kinds


def _decided_by_sign(expr) -> bool:
    """Whether a guard is ``c * s <rel> 0`` for one symbol ``s`` and a constant ``c != 0``,
    whose truth the sign of ``s`` decides."""
    import sympy

    if not isinstance(expr, sympy.core.relational.Relational):
        return False
    difference = sympy.expand(expr.lhs - expr.rhs)
    (symbol,) = difference.free_symbols
    slope = sympy.diff(difference, symbol)
    return (
        not slope.free_symbols and slope != 0 and sympy.simplify(difference - slope * symbol) == 0
    )


# ------------------------------------------------------------- the arithmetic in a graph
#: Python-number functions a trace records on symbolic scalars, by name (the graph cache
#: stores them so), with their JAX counterparts (jax.numpy keeps weak types).
def _jax_functions() -> dict:
    import jax.numpy as jnp

    def sym_not(a):
        return jnp.logical_not(a)

    return {
        "add": (operator.add, operator.add),
        "sub": (operator.sub, operator.sub),
        "mul": (operator.mul, operator.mul),
        "truediv": (operator.truediv, operator.truediv),
        "floordiv": (operator.floordiv, jnp.floor_divide),
        "mod": (operator.mod, jnp.mod),
        "pow": (operator.pow, operator.pow),
        "neg": (operator.neg, operator.neg),
        "pos": (operator.pos, operator.pos),
        "abs": (operator.abs, jnp.abs),
        "eq": (operator.eq, jnp.equal),
        "ne": (operator.ne, jnp.not_equal),
        "lt": (operator.lt, jnp.less),
        "le": (operator.le, jnp.less_equal),
        "gt": (operator.gt, jnp.greater),
        "ge": (operator.ge, jnp.greater_equal),
        "sym_float": (torch.sym_float, lambda a: jnp.asarray(a) * 1.0),
        "sym_sqrt": (getattr(torch, "_sym_sqrt", math.sqrt), jnp.sqrt),
        "sym_max": (torch.sym_max, jnp.maximum),
        "sym_min": (torch.sym_min, jnp.minimum),
        "sym_not": (torch.sym_not, sym_not),
    }


FUNCTIONS = _jax_functions()
#: graph target -> its name in ``FUNCTIONS``.
NAME_OF = {python: name for name, (python, _) in FUNCTIONS.items()}
