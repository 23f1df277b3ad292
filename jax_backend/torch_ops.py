"""torch custom ops whose meaning is a pure JAX function.

``cstorch::optimizer_step`` and ``cstorch::schedule`` let torch-facing code (cstorch's
optimizers and schedulers) put an optimizer update or a schedule into a traced step as one
graph node. Their lowering calls ``jax_backend.optimizers`` / ``jax_backend.schedules``
directly, and their eager implementation (used outside a traced step) runs the very same JAX
code on copies of the tensors, so there is a single definition of the maths.
"""

from __future__ import annotations

import functools
import json
from typing import List

import jax
import jax.numpy as jnp
import torch

from jax_backend import optimizers, schedules
from jax_backend.dtypes import array_to_tensor, tensor_to_array, to_jax_dtype
from jax_backend.registry import lowers


def optimizer_spec(name: str, static_hyperparams: dict, dynamic_names) -> str:
    """The JSON that names an update rule, its constant hyperparameters and the names of the
    hyperparameters passed as tensors (e.g. a scheduled ``learning_rate``)."""
    return json.dumps({"name": name, "static": static_hyperparams,
                       "dynamic": list(dynamic_names)}, sort_keys=True)


def optimizer_state_layout(name: str, static_hyperparams: dict, dynamic_names, params):
    """``(fields, keys_per_param)``: the update rule's state fields in order (the order of
    ``optimizer_step``'s state leaves) and the torch state keys of each of ``params`` (only
    their shapes and dtypes matter). Keys differ between parameters only for Adafactor.

    A hyperparameter passed as a tensor counts as non-zero here (as it does under ``jit``), so
    optional state it switches on is expected."""
    shapes = tuple((tuple(p.shape), p.dtype) for p in params)
    return _state_layout(name, json.dumps(static_hyperparams, sort_keys=True),
                         tuple(sorted(dynamic_names)), shapes)


@functools.lru_cache(maxsize=1024)
def _state_layout(name, static_json, dynamic_names, shapes):
    hyper = json.loads(static_json)
    hyper.update({key: 1.0 for key in dynamic_names})
    structs = [jax.ShapeDtypeStruct(shape, to_jax_dtype(dtype)) for shape, dtype in shapes]
    state = jax.eval_shape(optimizers.build(name, hyper).init, structs)
    return (tuple(state._fields),
            tuple(optimizers.param_state_keys(state, i) for i in range(len(shapes))))


def init_optimizer_state(name: str, hyperparams: dict, params) -> dict:
    """The initial state of an update rule for torch ``params``: ``{key: [tensor per param]}``
    (``None`` where a key does not apply to a parameter, see ``optimizers.param_state_keys``).

    Initial states depend on shapes and hyperparameters only, so the parameters' values are
    not copied to the device for this."""
    shaped = [jnp.zeros(tuple(p.shape), to_jax_dtype(p.dtype)) for p in params]
    state = optimizers.init_state(name, hyperparams, shaped)
    return {key: [None if a is None else array_to_tensor(a) for a in arrays]
            for key, arrays in state.items()}


def _optimizer_step_jax(spec, params, grads, state, dynamic_values):
    spec = json.loads(spec)
    hyper = dict(spec["static"])
    hyper.update({k: jnp.asarray(v) for k, v in zip(spec["dynamic"], dynamic_values)})
    new_params, new_state = optimizers.apply(spec["name"], hyper, params, grads, state)
    return list(new_params) + list(new_state)


@torch.library.custom_op("cstorch::optimizer_step", mutates_args=())
def optimizer_step(spec: str, params: List[torch.Tensor], grads: List[torch.Tensor],
                   state: List[torch.Tensor], dynamic_values: List[torch.Tensor]
                   ) -> List[torch.Tensor]:
    """New parameters followed by new state leaves (see ``optimizers.apply``)."""
    to_jax = lambda ts: [tensor_to_array(t) for t in ts]  # noqa: E731
    outs = _optimizer_step_jax(spec, to_jax(params), to_jax(grads), to_jax(state),
                               to_jax(dynamic_values))
    return [array_to_tensor(o) for o in outs]


@optimizer_step.register_fake
def _optimizer_step_fake(spec, params, grads, state, dynamic_values):
    return [torch.empty_like(t) for t in list(params) + list(state)]


lowers(torch.ops.cstorch.optimizer_step.default)(_optimizer_step_jax)


def _schedule_jax(config, step):
    return schedules.from_config(json.loads(config))(step)


@torch.library.custom_op("cstorch::schedule", mutates_args=())
def schedule(config: str, step: torch.Tensor) -> torch.Tensor:
    """The value (float32, 0-dim) of the schedule described by ``config`` at ``step``."""
    return array_to_tensor(_schedule_jax(config, tensor_to_array(step)))


@schedule.register_fake
def _schedule_fake(config, step):
    return torch.empty((), dtype=torch.float32)


lowers(torch.ops.cstorch.schedule.default)(_schedule_jax)


def schedule_config(config: dict) -> str:
    """Canonical JSON for a schedule config (also a stable cache key)."""
    return json.dumps(config, sort_keys=True)
