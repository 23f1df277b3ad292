"""torch custom ops whose meaning is a pure JAX function.

``cstorch::optimizer_step`` and ``cstorch::schedule`` let torch-facing code (cstorch's
optimizers and schedulers) put an optimizer update or a schedule into a traced step as one
graph node (an optimizer traces ``cstorch::optimizer_update``, the same update written in
place, which the capture turns into ``optimizer_step`` and the writes). Their lowering calls
``jax_backend.optimizers`` / ``jax_backend.schedules`` directly, and their eager
implementation (used outside a traced step) runs the very same JAX code on copies of the
tensors, so there is a single definition of the maths.

Each op carries its own description in the graph, as a canonical JSON string: the schedule
op its config (``schedule_config``), the optimizer op its spec (``optimizer_config``: the
rule, its constant hyperparameters and the names of those passed as tensors). So a graph
means the same in any process (the graph cache stores it as it is), with no registry to
fill first. The state layout for a spec and parameter shapes is computed once
(``state_layout``) and shared by the torch side, which orders the state tensors by it, and
the lowering, which rebuilds the state from them.
"""

from __future__ import annotations

import functools
import json
from typing import List, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch

from jax_backend import native_optimizer, optimizers, schedules
from jax_backend.dtypes import array_to_tensor, initial_tensor, tensor_to_array, to_jax_dtype
from jax_backend.errors import CstorchValueError
from jax_backend.jax_settings import engine_scope, in_engine_scope
from jax_backend.registry import lowers, writes_lists


class OptimizerSpec(NamedTuple):
    """An update rule with its constant hyperparameters, and the names of those passed as
    tensors (in the order of ``optimizer_step``'s ``dynamic_values``)."""

    name: str
    static_json: str  # canonical JSON of the constant hyperparameters
    dynamic: tuple

    def hyperparameters(self, dynamic_values) -> dict:
        hyper = json.loads(self.static_json)
        hyper.update(zip(self.dynamic, dynamic_values))
        return hyper


class StateLayout(NamedTuple):
    """How an update rule's state is laid out for given parameter shapes."""

    fields: tuple  # the rule's state fields, in the order of its state leaves
    keys_per_param: tuple  # the torch state keys of each parameter (differ only for Adafactor)
    treedef: object  # the state's pytree structure (``jax.tree.structure``)


def optimizer_config(name: str, static_hyperparams: dict, dynamic_names) -> str:
    """The spec ``cstorch::optimizer_step`` carries for this rule and hyperparameters:
    canonical JSON of ``{"rule", "static", "dynamic"}`` (``optimizer_spec`` reads it)."""
    return json.dumps(
        {"rule": name, "static": static_hyperparams, "dynamic": list(dynamic_names)}, sort_keys=True
    )


@functools.lru_cache(maxsize=1024)
def optimizer_spec(config: str) -> OptimizerSpec:
    """The spec an ``optimizer_config`` string describes. Raises ValueError for one that is
    not of that form (a graph from elsewhere is checked with it)."""
    try:
        spec = json.loads(config) if isinstance(config, str) else None
    except ValueError:
        spec = None
    if not (
        isinstance(spec, dict)
        and sorted(spec) == ["dynamic", "rule", "static"]
        and spec["rule"] in optimizers.OPTIMIZERS
        and isinstance(spec["static"], dict)
        and isinstance(spec["dynamic"], list)
        and all(isinstance(d, str) for d in spec["dynamic"])
    ):
        raise CstorchValueError(
            f"not an optimizer spec made by optimizer_config(): {config!r:.200}"
        )
    return OptimizerSpec(
        spec["rule"], json.dumps(spec["static"], sort_keys=True), tuple(spec["dynamic"])
    )


@functools.lru_cache(maxsize=1024)
def state_layout(config: str, shapes: tuple) -> StateLayout:
    """The state layout of the rule ``config`` describes for parameters of ``shapes``
    (``((shape, jax dtype name), ...)``), computed once per (spec, shapes).

    A hyperparameter passed as a tensor counts as non-zero here (as it does under ``jit``),
    so optional state it switches on is expected."""
    spec = optimizer_spec(config)
    hyper = spec.hyperparameters([1.0] * len(spec.dynamic))
    structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    state = jax.eval_shape(optimizers.build(spec.name, hyper).init, structs)
    return StateLayout(
        tuple(state._fields),
        tuple(optimizers.param_state_keys(state, i) for i in range(len(shapes))),
        jax.tree.structure(state),
    )


def _shapes(arrays) -> tuple:
    """``state_layout``'s key for torch tensors or JAX arrays."""
    # (numpy dtypes, not jnp.dtype: a Ctrl-C inside JAX's dtype property comes out garbled)
    return tuple(
        (
            tuple(a.shape),
            (to_jax_dtype(a.dtype) if isinstance(a, torch.Tensor) else np.dtype(a.dtype)).name,
        )
        for a in arrays
    )


@in_engine_scope
def optimizer_state_layout(config: str, params) -> StateLayout:
    """``state_layout`` for torch ``params`` (only their shapes and dtypes matter)."""
    return state_layout(config, _shapes(params))


@in_engine_scope
def init_optimizer_state(name: str, hyperparams: dict, params) -> dict:
    """The initial state of an update rule for torch ``params``: ``{key: [tensor per param]}``
    (``None`` where a key does not apply to a parameter, see ``optimizers.param_state_keys``).

    Initial states depend on shapes and hyperparameters only, so the parameters' values are
    not copied to the device for this."""
    shapes = [(tuple(p.shape), to_jax_dtype(p.dtype)) for p in params]

    # One small program for all of them: run op by op, every distinct shape compiled a program
    # of its own (time and resident compiler memory at setup). It returns the state NamedTuple,
    # whose keys keep their order (a dict's would come back sorted).
    @jax.jit
    def initial():
        return optimizers.build(name, hyperparams).init([jnp.zeros(*s) for s in shapes])

    state = optimizers.state_dict(initial())
    return {
        key: [None if a is None else initial_tensor(a) for a in arrays]
        for key, arrays in state.items()
    }


def _optimizer_step_jax(config, params, grads, state, dynamic_values):
    spec = optimizer_spec(config)
    hyper = spec.hyperparameters([jnp.asarray(v) for v in dynamic_values])
    treedef = state_layout(config, _shapes(params)).treedef
    fused = None
    if native_optimizer.applies():  # the engine's CPU program: one native call
        fused = native_optimizer.update(spec.name, hyper, params, grads, state, treedef)
    new_params, new_state = fused or optimizers.apply(
        spec.name, hyper, params, grads, state, treedef=treedef
    )
    return list(new_params) + list(new_state)


@torch.library.custom_op("cstorch::optimizer_step", mutates_args=())
def optimizer_step(
    config: str,
    params: List[torch.Tensor],
    grads: List[torch.Tensor],
    state: List[torch.Tensor],
    dynamic_values: List[torch.Tensor],
) -> List[torch.Tensor]:
    """New parameters followed by new state leaves (see ``optimizers.apply``); ``config``
    comes from ``optimizer_config``."""
    to_jax = lambda ts: [tensor_to_array(t) for t in ts]  # noqa: E731
    with engine_scope():
        outs = _optimizer_step_jax(
            config, to_jax(params), to_jax(grads), to_jax(state), to_jax(dynamic_values)
        )
    return [array_to_tensor(o) for o in outs]


@optimizer_step.register_fake
def _optimizer_step_fake(config, params, grads, state, dynamic_values):
    return [torch.empty_like(t) for t in list(params) + list(state)]


lowers(torch.ops.cstorch.optimizer_step.default)(_optimizer_step_jax)


@torch.library.custom_op("cstorch::optimizer_update", mutates_args=("params", "state"))
def optimizer_update(
    config: str,
    params: List[torch.Tensor],
    grads: List[torch.Tensor],
    state: List[torch.Tensor],
    dynamic_values: List[torch.Tensor],
) -> None:
    """``optimizer_step`` written into ``params`` and ``state`` in place. A step traces this
    one node where the functional op and a ``copy_`` per tensor cost a quarter of a
    transformer's capture; the capture turns it back into those (``registry.writes_lists``)."""
    outputs = optimizer_step(config, params, grads, state, dynamic_values)
    with torch.no_grad():
        for target, value in zip(list(params) + list(state), outputs):
            target.copy_(value)


@optimizer_update.register_fake
def _optimizer_update_fake(config, params, grads, state, dynamic_values):
    return None


writes_lists(
    torch.ops.cstorch.optimizer_update.default,
    torch.ops.cstorch.optimizer_step.default,
    positions=(1, 3),
)


def _schedule_jax(config, step):
    return schedules.from_config(json.loads(config))(step)


@functools.lru_cache(maxsize=64)
def _compiled_schedule(config: str):
    """The schedule described by ``config`` as one jitted program, for its values outside a
    step (a scheduler's construction, the eager engine's steps). Run op by op, a
    warmup-then-cosine schedule compiled fifteen one-op programs on its first value (its
    scheduler's construction took 1.3 s without the compilation cache, now 0.2 s), and its
    values on the eager engine were 1-2 ulp off those the JAX engine's step computed; jitted,
    it is one program, compiled as the step's own copy of it is. Configs come from
    schedulers' constructor arguments: a process has few."""
    return jax.jit(schedules.from_config(json.loads(config)))


@torch.library.custom_op("cstorch::schedule", mutates_args=())
def schedule(config: str, step: torch.Tensor) -> torch.Tensor:
    """The value (float32, 0-dim) of the schedule described by ``config`` at ``step``."""
    with engine_scope():
        return array_to_tensor(_compiled_schedule(config)(tensor_to_array(step)))


@schedule.register_fake
def _schedule_fake(config, step):
    return torch.empty((), dtype=torch.float32)


lowers(torch.ops.cstorch.schedule.default)(_schedule_jax)


def schedule_config(config: dict) -> str:
    """Canonical JSON for a schedule config (also a stable cache key)."""
    return json.dumps(config, sort_keys=True)
