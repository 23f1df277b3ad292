"""Optimizer update rules as pure, optax-compatible transformations.

Each factory returns an ``optax.GradientTransformation`` whose ``update`` gives the *updates*
(to be added with ``optax.apply_updates``), with the numerics of cerebras-pytorch 2.10's
optimizers. States are NamedTuples whose fields are named after the torch state keys of the
cstorch optimizer (``exp_avg``, ``momentum_buffer``, ...): every field holds one array per
parameter (a list matching ``params``), or ``None`` when the option that needs it is off. That
convention is what lets ``cstorch.optim`` translate torch ``state_dict``s to these states.

Hyperparameters may be Python floats or JAX scalars, so the same factories serve
``optax.inject_hyperparams`` and the traced cstorch step (where ``lr`` is a tensor).

>>> import jax.numpy as jnp, optax
>>> tx = sgd(learning_rate=0.1, momentum=0.9)
>>> params = [jnp.ones(2)]
>>> state = tx.init(params)
>>> updates, state = tx.update([jnp.full(2, 0.5)], state, params)
>>> optax.apply_updates(params, updates)[0]
Array([0.95, 0.95], dtype=float32)
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax


def _zeros_like(params):
    return [jnp.zeros_like(p) for p in params]


def _full_like_scalar(params, value):
    return [jnp.asarray(value, jnp.float32) for _ in params]


def state_keys(state) -> tuple:
    """The torch state keys an optimizer state holds (its fields that are not None)."""
    return tuple(f for f in state._fields if getattr(state, f) is not None)


# ------------------------------------------------------------------------------------ SGD
class SGDState(NamedTuple):
    momentum_buffer: list | None  # per param, zeros at init (cstorch starts from zero)


def sgd(learning_rate, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
        maximize=False) -> optax.GradientTransformation:
    """cstorch SGD: ``g = ±grad + wd·p``; ``buf = m·buf + (1-dampening)·g``; ``p -= lr·d`` with
    ``d = g + m·buf`` (Nesterov) or ``buf``. Unlike torch, the buffer starts at zero."""

    def init(params):
        return SGDState(_zeros_like(params) if momentum != 0 else None)

    def update(grads, state, params):
        new_buffers, updates = [], []
        for i, (g, p) in enumerate(zip(grads, params)):
            g = -g if maximize else g
            g = g + p * weight_decay
            if momentum != 0:
                buf = state.momentum_buffer[i] * momentum + g * (1.0 - dampening)
                new_buffers.append(buf)
                g = g + buf * momentum if nesterov else buf
            updates.append((-learning_rate * g).astype(p.dtype))
        return updates, SGDState(new_buffers if momentum != 0 else None)

    return optax.GradientTransformation(init, update)


# ---------------------------------------------------------------------------- Adam / AdamW
class AdamState(NamedTuple):
    exp_avg: list
    exp_avg_sq: list
    max_exp_avg_sq: list | None  # only with amsgrad
    beta1_power: list | None  # beta^t per param (0-dim), only with correct_bias
    beta2_power: list | None


def adam_base(learning_rate=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
              l2_regularization_rate=0.0, correct_bias=True, amsgrad=False
              ) -> optax.GradientTransformation:
    """cstorch's Adam family. The bias correction multiplies the update by
    ``sqrt(1-β2^t)/(1-β1^t)`` *after* adding eps to ``sqrt(v)`` ("eps-hat" placement, unlike
    torch); ``l2_regularization_rate`` adds ``rate·p`` to the gradient (Adam's coupled L2),
    ``weight_decay`` adds ``wd·p`` to the update (AdamW's decoupled decay)."""
    beta1, beta2 = betas

    def init(params):
        return AdamState(
            exp_avg=_zeros_like(params),
            exp_avg_sq=_zeros_like(params),
            max_exp_avg_sq=_zeros_like(params) if amsgrad else None,
            beta1_power=_full_like_scalar(params, beta1) if correct_bias else None,
            beta2_power=_full_like_scalar(params, beta2) if correct_bias else None,
        )

    def update(grads, state, params):
        out = {k: [] for k in AdamState._fields}
        updates = []
        for i, (g, p) in enumerate(zip(grads, params)):
            if l2_regularization_rate > 0.0:
                g = g + p * l2_regularization_rate
            m = state.exp_avg[i] * beta1 + g * (1.0 - beta1)
            v = state.exp_avg_sq[i] * beta2 + (1.0 - beta2) * (g * g)
            out["exp_avg"].append(m)
            out["exp_avg_sq"].append(v)
            if amsgrad:
                v = jnp.maximum(state.max_exp_avg_sq[i], v)
                out["max_exp_avg_sq"].append(v)
            step = m / (jnp.sqrt(v) + eps)
            if correct_bias:
                b1, b2 = state.beta1_power[i], state.beta2_power[i]
                step = step * (jnp.sqrt(1.0 - b2) / (1.0 - b1))
                out["beta1_power"].append(b1 * beta1)
                out["beta2_power"].append(b2 * beta2)
            step = step + p * weight_decay
            updates.append((-(step * learning_rate)).astype(p.dtype))
        return updates, AdamState(**{k: (v if v else None) for k, v in out.items()})

    return optax.GradientTransformation(init, update)


def adam(learning_rate=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, amsgrad=False):
    """cstorch Adam: ``weight_decay`` is coupled L2 regularisation."""
    return adam_base(learning_rate, betas, eps, 0.0, weight_decay, True, amsgrad)


def adamw(learning_rate=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
          correct_bias=True, amsgrad=False):
    """cstorch AdamW: decoupled weight decay."""
    return adam_base(learning_rate, betas, eps, weight_decay, 0.0, correct_bias, amsgrad)


# ------------------------------------------------------------------------------- registry
OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "sgd": sgd,
    "adam_base": adam_base,
    "adam": adam,
    "adamw": adamw,
}


def build(name: str, hyperparams: dict) -> optax.GradientTransformation:
    try:
        factory = OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; known: {sorted(OPTIMIZERS)}") from None
    return factory(**hyperparams)


def apply(name: str, hyperparams: dict, params, grads, state_leaves):
    """One update of the named optimizer on flat lists; returns (new_params, new_state_leaves).

    ``state_leaves`` are the state's leaves in ``jax.tree.leaves`` order: field by field, each
    field one array per parameter.
    """
    tx = build(name, hyperparams)
    treedef = jax.tree.structure(jax.eval_shape(tx.init, params))
    state = jax.tree.unflatten(treedef, list(state_leaves))
    updates, new_state = tx.update(list(grads), state, list(params))
    new_params = optax.apply_updates(list(params), updates)
    return list(new_params), jax.tree.leaves(new_state)


def init_state(name: str, hyperparams: dict, params) -> dict:
    """Initial state as ``{torch_key: [one array per param]}``."""
    state = build(name, hyperparams).init(list(params))
    return {key: getattr(state, key) for key in state_keys(state)}
