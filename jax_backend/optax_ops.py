"""``cstorch::optax_update``: any ``optax.GradientTransformation`` as one op of a torch step.

The transformation is registered here once (``register``) and named in the graph by an
integer key; the op takes the parameters, their gradients and the leaves of the optax state
(flattened in the order of the state's treedef) and returns the new parameters followed by
the new state leaves. Its lowering is the transformation's own ``update`` plus
``optax.apply_updates``; its eager implementation runs the same function jitted.
"""

from __future__ import annotations

import functools
from typing import List

import jax
import torch

from jax_backend.dtypes import array_to_tensor, tensor_to_array
from jax_backend.errors import CstorchValueError
from jax_backend.jax_settings import engine_scope
from jax_backend.registry import lowers

_TRANSFORMS: dict = {}  # key -> (transformation, treedef of its state)


def register(transformation, treedef) -> int:
    """A key naming ``transformation`` (whose state has structure ``treedef``) in graphs."""
    key = len(_TRANSFORMS)
    _TRANSFORMS[key] = (transformation, treedef)
    return key


def _update_jax(key, params, grads, state):
    import optax

    transformation, treedef = _TRANSFORMS[key]
    opt_state = jax.tree_util.tree_unflatten(treedef, list(state))
    # The transformation is the user's (optax) code, written for JAX's standard promotion
    # (``1 - b1 ** count`` with an int32 count); it keeps it even if the caller made JAX strict.
    with jax.numpy_dtype_promotion("standard"):
        updates, new_state = transformation.update(list(grads), opt_state, list(params))
        new_params = optax.apply_updates(list(params), updates)
    new_leaves = jax.tree_util.tree_leaves(new_state)
    if len(new_leaves) != len(state):
        raise CstorchValueError(
            f"The optax transformation changed the number of its state leaves from "
            f"{len(state)} to {len(new_leaves)}; cstorch keeps optimizer state of a fixed "
            "structure."
        )
    # Keep every dtype stable (torch state tensors are updated in place).
    return [p.astype(old.dtype) for p, old in zip(new_params, params)] + [
        s.astype(old.dtype) for s, old in zip(new_leaves, state)
    ]


@functools.lru_cache(maxsize=None)
def _jitted(key):
    return jax.jit(functools.partial(_update_jax, key))


@torch.library.custom_op("cstorch::optax_update", mutates_args=())
def optax_update(
    key: int, params: List[torch.Tensor], grads: List[torch.Tensor], state: List[torch.Tensor]
) -> List[torch.Tensor]:
    """New parameters followed by new state leaves."""
    to_jax = lambda ts: [tensor_to_array(t) for t in ts]  # noqa: E731
    with engine_scope():
        outputs = _jitted(key)(to_jax(params), to_jax(grads), to_jax(state))
    return [array_to_tensor(o) for o in outputs]


@optax_update.register_fake
def _optax_update_fake(key, params, grads, state):
    return [torch.empty_like(t) for t in list(params) + list(state)]


lowers(torch.ops.cstorch.optax_update.default)(_update_jax)
