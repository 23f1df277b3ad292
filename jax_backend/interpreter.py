"""Runs a functional ATen FX graph on JAX arrays, one registered lowering per node.

This is the ``eval_jaxpr`` of the project: called under ``jax.jit`` it runs once per
compilation, so its per-node Python cost is a trace-time cost only.

Every node carries torch's own result metadata (``node.meta["val"]``, a fake tensor). After a
lowering runs, its result is checked against that shape and cast to that dtype, so torch's
dtype semantics hold even where JAX promotes differently; ``strict=True`` turns a dtype
mismatch into an error instead (the op tests use it to keep the lowerings honest).
"""

from __future__ import annotations

import contextvars
import operator
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch.fx

from jax_backend import dtypes
from jax_backend.errors import JaxBackendError, LoweringError
from jax_backend.registry import TransposedOperand, lookup

aten = torch.ops.aten

_run_scratch = contextvars.ContextVar("graph_run_scratch", default=None)


def run_scratch() -> dict:
    """A dict that lives while the current graph runs (one trace): the lowerings of a forward
    op and its backward op leave values there for each other (``ops.attention``). Outside a
    run, a fresh dict that nothing else sees."""
    scratch = _run_scratch.get()
    return {} if scratch is None else scratch


class LoweringMismatchError(JaxBackendError):
    """A lowering returned a result whose shape or dtype differs from torch's."""


def _map_args(value, env):
    if isinstance(value, torch.fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        mapped = [_map_args(v, env) for v in value]
        return type(value)(mapped) if isinstance(value, tuple) else mapped
    if isinstance(value, dict):
        return {k: _map_args(v, env) for k, v in value.items()}
    if isinstance(value, torch.Tensor):  # tensors baked into node arguments
        return jnp.asarray(dtypes.tensor_to_numpy(value))
    return value


def _swaps_last_two(node) -> bool:
    """Whether ``node`` is a transpose of its input's last two dims (``t``, ``transpose``,
    or a ``permute`` that moves nothing else)."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    val = node.meta.get("val")
    ndim = val.dim() if isinstance(val, torch.Tensor) else 0
    args: Any = node.args  # (FX types arguments as any argument)
    if ndim < 2 or not isinstance(args[0], torch.fx.Node):
        return False
    if node.target is aten.t.default:
        return True
    if node.target is aten.transpose.int:
        return {d % ndim for d in args[1:3]} == {ndim - 2, ndim - 1}
    if node.target is aten.permute.default:
        return [d % ndim for d in args[1]] == [*range(ndim - 2), ndim - 1, ndim - 2]
    return False


def _operand(node, value, env):
    """A matrix product's operand: its ``value``, or a ``TransposedOperand`` where a chain
    of last-two-dims transposes produced it."""
    source, flipped = node, False
    while _swaps_last_two(source):
        source, flipped = source.args[0], not flipped
    return value if source is node else TransposedOperand(value, env[source], flipped)


def _conform(node, result, expected, strict, emulation=None):
    """Checks a lowering's result against torch's metadata and casts it to torch's dtype
    (to the dtype ``emulation`` holds it in, rounded, for an emulated dtype)."""
    if isinstance(expected, torch.Tensor):
        if result is None:
            return None
        shape = tuple(expected.shape)
        if tuple(result.shape) != shape:
            raise LoweringMismatchError(
                f"lowering of {node.target} returned shape {tuple(result.shape)}, torch expects "
                f"{shape} (node {node.name})."
            )
        dtype, emulated = (
            emulation.storage_dtype(expected.dtype) if emulation is not None else (None, False)
        )
        dtype = dtype if dtype is not None else dtypes.to_jax_dtype(expected.dtype)
        if emulated:
            return emulation.result(result)
        if result.dtype != dtype:
            if strict:
                raise LoweringMismatchError(
                    f"lowering of {node.target} returned dtype {result.dtype}, torch expects "
                    f"{dtype} (node {node.name})."
                )
            result = result.astype(dtype)
        return result
    if isinstance(expected, (list, tuple)) and isinstance(result, (list, tuple)):
        return type(result)(
            _conform(node, r, e, strict, emulation) for r, e in zip(result, expected)
        )
    return result


def _describe_inputs(node) -> list:
    """``dtype[shape]`` of each tensor input of ``node``, as torch traced it."""
    described = []
    for arg in node.all_input_nodes:
        value = arg.meta.get("val")
        if isinstance(value, torch.Tensor):
            described.append(f"{value.dtype}{list(value.shape)}".replace("torch.", ""))
        else:
            described.append(type(value).__name__)
    return described


class GraphInterpreter:
    """Evaluates a functional FX graph with JAX lowerings.

    ``constants`` maps ``get_attr`` targets to arrays; random nodes draw keys folded from the
    ``key`` given to ``run``. ``emulation`` (e.g. ``cbfloat16.Float16AsCbfloat16``) holds one
    torch dtype of the graph as another format: it converts inputs, dtype arguments, results
    and outputs.
    """

    def __init__(self, graph_module: torch.fx.GraphModule, *, strict: bool = False, emulation=None):
        self.graph_module = graph_module
        self.strict = strict
        self.emulation = emulation
        self.placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]

    def run(self, inputs, key=None):
        if len(inputs) != len(self.placeholders):
            raise JaxBackendError(f"graph takes {len(self.placeholders)} inputs, got {len(inputs)}")
        token = _run_scratch.set({})
        try:
            return self._run(inputs, key)
        finally:
            _run_scratch.reset(token)

    def _run(self, inputs, key):
        emulation = self.emulation
        if emulation is not None:
            inputs = [emulation.enter(x) for x in inputs]
        env = dict(zip(self.placeholders, inputs))
        random_index = 0
        for node in self.graph_module.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                if emulation is not None:
                    return _map_args(
                        node.args[0],
                        {n: emulation.leave(v, n.meta.get("val")) for n, v in env.items()},
                    )
                return _map_args(node.args[0], env)
            if node.op == "get_attr":
                env[node] = jnp.asarray(
                    dtypes.tensor_to_numpy(getattr(self.graph_module, node.target))
                )
                if emulation is not None:
                    env[node] = emulation.enter(env[node])
                continue
            if node.op != "call_function":
                raise JaxBackendError(f"unexpected FX node kind {node.op!r} ({node.name})")
            args = _map_args(node.args, env)
            kwargs = _map_args(node.kwargs, env)
            if emulation is not None:
                args, kwargs = emulation.arguments(args, kwargs)
            if node.target is operator.getitem:
                env[node] = args[0][args[1]]
                continue
            lowering = lookup(node.target)
            if lowering.transposed_operands and emulation is None:
                args = tuple(
                    _operand(a, v, env) if i in lowering.transposed_operands else v
                    for i, (a, v) in enumerate(zip(node.args, args))
                )
            if lowering.random:
                if key is None:
                    raise JaxBackendError(f"{node.target} needs a PRNG key but none was given")
                kwargs["key"] = jax.random.fold_in(key, random_index)
                random_index += 1
            try:
                result = lowering.fn(*args, **kwargs)
            except Exception as err:  # re-raised with the op and node named
                raise LoweringError(node.target, node.name, _describe_inputs(node), err) from err
            env[node] = _conform(node, result, node.meta.get("val"), self.strict, emulation)
        raise JaxBackendError("graph has no output node")
