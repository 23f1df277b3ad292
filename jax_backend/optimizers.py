"""Optimizer update rules as pure, optax-compatible transformations.

Each factory returns an ``optax.GradientTransformation`` whose ``update`` gives the *updates*
(to be added with ``optax.apply_updates``), with the numerics of cerebras-pytorch 2.10's
optimizers. States are NamedTuples whose fields are named after the torch state keys of the
cstorch optimizer (``exp_avg``, ``momentum_buffer``, ...), in the order the cstorch optimizer
inserts them (``preinitialize`` first, then the per-parameter ``step`` of the optimizers built
with ``enable_global_step``). ``params`` may be any pytree (a list of arrays, a flax-style
nested dict), as for optax's transformations. Every field holds one array per parameter (a
list in ``jax.tree.leaves(params)`` order; 0-dim float32 arrays for scalar state such as
``step`` or ``beta1_power``), or
``None`` when the option that needs it is off. Adafactor is the one optimizer whose keys differ
from parameter to parameter (factored moments for ``ndim >= 2``): its lists hold ``None`` for
the parameters a key does not apply to (see ``param_state_keys``). That convention is what
lets ``cstorch.optim`` translate torch ``state_dict``s to these states.

Hyperparameters may be Python floats or JAX scalars, so the same factories serve
``optax.inject_hyperparams`` and the traced cstorch step (where ``lr`` is a tensor). Which
optional state exists (``momentum_buffer`` and the like) is decided by ``init``; ``update``
follows the state it is given, so it never branches on the value of a traced hyperparameter.
Where the reference multiplies the parameter before adding to it (Lion, ASGD, Adafactor,
Muon), the update is the difference between the reference's new parameter and the old one.

Each rule is one function rather than an optax chain (``add_decayed_weights`` then
``scale_by_adam`` then ``scale_by_learning_rate``) on purpose: the results must match the
reference's float32 arithmetic bit for bit where it can, and floating-point operations do
not reassociate; a chain fixes its own order of operations (it scales by ``-lr`` last, for
instance), which differs from the reference's in-place torch sequence. The pieces the rules
share are small helpers instead (``_maximized``, ``_coupled_l2``, ``_ema``), each keeping the
reference's operand order.

>>> import jax.numpy as jnp, optax
>>> tx = sgd(learning_rate=0.1, momentum=0.9)
>>> params = [jnp.ones(2, jnp.float32)]
>>> state = tx.init(params)
>>> updates, state = tx.update([jnp.full(2, 0.5, jnp.float32)], state, params)
>>> optax.apply_updates(params, updates)[0]
Array([0.95, 0.95], dtype=float32)
"""

from __future__ import annotations

import numbers
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_backend.errors import CstorchValueError

_F32 = jnp.float32


# -------------------------------------------------------------------------------- helpers
def _zeros_like(params):
    return [jnp.zeros_like(p) for p in params]


def _full_like_scalar(params, value):
    return [jnp.asarray(value, _F32) for _ in params]


def _f32(value):
    """A float32 0-dim array, as ``torch.tensor(value)`` makes in the reference."""
    return jnp.asarray(value, _F32)


def _is_python_number(value) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, (jax.Array, np.ndarray))


def _is_on(value) -> bool:
    """Whether a structural numeric option (``momentum``...) is non-zero, decided at ``init``.

    A traced value (``init`` under ``jit``) counts as on: the state is allocated and the maths
    is then right for any value."""
    if _is_python_number(value):
        return value != 0
    try:
        return bool(jnp.any(jnp.asarray(value) != 0))
    except jax.errors.ConcretizationTypeError:
        return True


def _like(new, old):
    """``new`` in the dtype of ``old`` (keeps state dtypes stable whatever the hyperparams)."""
    return jnp.asarray(new).astype(old.dtype)


def _row(state, i) -> dict:
    """The state of parameter ``i`` as ``{field: array or None}``."""
    return {f: (None if v is None else v[i]) for f, v in zip(state._fields, state)}


def _stack(state, rows):
    """The inverse of ``_row``: rows -> a state of the same type and structure as ``state``."""
    return type(state)(
        **{f: (None if v is None else [r[f] for r in rows]) for f, v in zip(state._fields, state)}
    )


def _check_lengths(grads, state):
    for f, v in zip(state._fields, state):
        if v is not None and len(v) != len(grads):
            raise CstorchValueError(
                f"optimizer state field {f!r} has {len(v)} entries for "
                f"{len(grads)} parameters; call init with the same parameters first"
            )


def _per_param(rule):
    """An ``update`` that runs ``rule(g, p, row) -> (update, new_row)`` on each parameter."""

    def update(grads, state, params):
        if params is None:
            raise CstorchValueError("these cstorch optimizers need `params` in update")
        grads, params = list(grads), list(params)
        _check_lengths(grads, state)
        updates, rows = [], []
        for i, (g, p) in enumerate(zip(grads, params)):
            row = _row(state, i)
            u, new = rule(g, p, row)
            for k, v in new.items():
                new[k] = None if v is None else _like(v, row[k])
            row.update(new)
            rows.append(row)
            updates.append(jnp.asarray(u).astype(p.dtype))
        return updates, _stack(state, rows)

    return update


def _transformation(init, rule) -> optax.GradientTransformation:
    """The optax transformation of ``init(list of params)`` and a per-parameter ``rule``.

    Parameters may be any pytree (a list, a flax-style nested dict), as for optax's own
    transformations: the rules see its leaves in ``jax.tree.leaves`` order, the state's
    fields hold one array per leaf in that order, and the updates have the structure of
    ``grads``. A list of arrays is its own leaves, so the list form is unchanged."""
    per_param = _per_param(rule)

    def init_tree(params):
        return init(jax.tree.leaves(params))

    def update_tree(grads, state, params=None):
        if params is None:
            raise CstorchValueError("these cstorch optimizers need `params` in update")
        leaves, treedef = jax.tree.flatten(grads)
        param_leaves = jax.tree.leaves(params)
        if len(param_leaves) != len(leaves):
            raise CstorchValueError(
                f"grads has {len(leaves)} arrays but params has "
                f"{len(param_leaves)}; pass pytrees of the same structure"
            )
        updates, new_state = per_param(leaves, state, param_leaves)
        return jax.tree.unflatten(treedef, updates), new_state

    return optax.GradientTransformation(init_tree, update_tree)


def _maximized(g, maximize: bool):
    """The gradient to descend: ``-g`` when the objective is maximised (torch's ``maximize``)."""
    return -g if maximize else g


def _coupled_l2(g, p, weight_decay):
    """Coupled L2 regularisation, added to the gradient: ``g + p·weight_decay``."""
    return g + p * weight_decay


def _ema(average, value, decay):
    """The exponential moving average ``average·decay + value·(1 - decay)``, in the
    reference's operation order."""
    return average * decay + value * (1.0 - decay)


def _delta(new_p, p):
    """The update that takes ``p`` to the reference's ``new_p``."""
    return new_p.astype(p.dtype) - p


def state_keys(state) -> tuple:
    """The torch state keys an optimizer state holds (its fields that are not None).

    Accepts a state NamedTuple or the ``{key: [...]}`` dict of ``init_state``."""
    if isinstance(state, dict):
        return tuple(k for k, v in state.items() if v is not None)
    return tuple(f for f in state._fields if getattr(state, f) is not None)


def param_state_keys(state, index: int) -> tuple:
    """The torch state keys of parameter ``index`` (differs from ``state_keys`` only for
    Adafactor, whose factored and unfactored parameters keep different keys)."""
    items = state.items() if isinstance(state, dict) else zip(state._fields, state)
    return tuple(k for k, v in items if v is not None and v[index] is not None)


# ------------------------------------------------------------------------------------ SGD
class SGDState(NamedTuple):
    momentum_buffer: list | None  # per param, zeros at init (cstorch starts from zero)


def sgd(
    learning_rate, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False
) -> optax.GradientTransformation:
    """cstorch SGD.

    ``g = ±grad + wd·p``; with momentum ``buf = m·buf + (1-dampening)·g`` and
    ``d = g + m·buf`` (Nesterov) or ``buf``; ``p ← p - lr·d``. Unlike torch, the buffer starts
    at zero (so the first step already applies ``1-dampening``).
    """

    def init(params):
        return SGDState(_zeros_like(params) if _is_on(momentum) else None)

    def rule(g, p, s):
        g = _coupled_l2(_maximized(g, maximize), p, weight_decay)
        new = {}
        if s["momentum_buffer"] is not None:
            buf = s["momentum_buffer"] * momentum + g * (1.0 - dampening)
            new["momentum_buffer"] = buf
            g = g + buf * momentum if nesterov else buf
        return -learning_rate * g, new

    return _transformation(init, rule)


# ---------------------------------------------------------------------------- Adam / AdamW
class AdamState(NamedTuple):
    exp_avg: list
    exp_avg_sq: list
    max_exp_avg_sq: list | None  # only with amsgrad
    beta1_power: list | None  # β1^t per param (0-dim float32), only with correct_bias
    beta2_power: list | None


def adam_base(
    learning_rate=1e-3,
    betas=(0.9, 0.999),
    eps=1e-6,
    weight_decay=0.0,
    l2_regularization_rate=0.0,
    correct_bias=True,
    amsgrad=False,
) -> optax.GradientTransformation:
    """cstorch's Adam family (``AdamBase``).

    ``g += rate·p`` (coupled L2, only if ``l2_regularization_rate > 0``);
    ``m = β1·m + (1-β1)·g``; ``v = β2·v + (1-β2)·g²`` (``v = max(v_max, v)`` with amsgrad);
    ``u = m/(√v + eps)``, times ``√(1-β2^t)/(1-β1^t)`` if ``correct_bias`` — the bias
    correction comes *after* eps ("eps-hat" placement, unlike torch) and uses the stored powers
    ``beta1_power``/``beta2_power``, which start at β and are multiplied by β each step;
    ``u += wd·p`` (AdamW's decoupled decay); ``p ← p - lr·u``.
    """
    beta1, beta2 = betas[0], betas[1]

    def init(params):
        return AdamState(
            exp_avg=_zeros_like(params),
            exp_avg_sq=_zeros_like(params),
            max_exp_avg_sq=_zeros_like(params) if amsgrad else None,
            beta1_power=_full_like_scalar(params, beta1) if correct_bias else None,
            beta2_power=_full_like_scalar(params, beta2) if correct_bias else None,
        )

    def rule(g, p, s):
        if adds_l2(l2_regularization_rate):
            g = g + p * l2_regularization_rate
        m = _ema(s["exp_avg"], g, beta1)
        v = _ema(s["exp_avg_sq"], g * g, beta2)
        new = {"exp_avg": m, "exp_avg_sq": v}
        if s["max_exp_avg_sq"] is not None:
            v = jnp.maximum(s["max_exp_avg_sq"], v)
            new["max_exp_avg_sq"] = v
        u = m / (jnp.sqrt(v) + eps)
        if s["beta1_power"] is not None:
            b1, b2 = s["beta1_power"], s["beta2_power"]
            u = u * (jnp.sqrt(1.0 - b2) / (1.0 - b1))
            new["beta1_power"] = b1 * beta1
            new["beta2_power"] = b2 * beta2
        u = u + p * weight_decay
        return -(u * learning_rate), new

    return _transformation(init, rule)


def adds_l2(rate) -> bool:
    """Whether ``adam_base`` adds the coupled L2 term for ``l2_regularization_rate=rate``: the
    reference tests ``rate > 0.0`` on a float; a traced rate is always added."""
    return not _is_python_number(rate) or rate > 0.0


def adam(learning_rate=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, amsgrad=False):
    """cstorch Adam: ``weight_decay`` is coupled L2 regularisation (``adam_base``'s
    ``l2_regularization_rate``); bias correction always on."""
    return adam_base(learning_rate, betas, eps, 0.0, weight_decay, True, amsgrad)


def adamw(
    learning_rate=1e-3,
    betas=(0.9, 0.999),
    eps=1e-6,
    weight_decay=0.0,
    correct_bias=True,
    amsgrad=False,
):
    """cstorch AdamW: decoupled weight decay, ``u += wd·p`` after the bias correction."""
    return adam_base(learning_rate, betas, eps, weight_decay, 0.0, correct_bias, amsgrad)


# ------------------------------------------------------------------------------- Adadelta
class AdadeltaState(NamedTuple):
    square_avg: list  # zeros
    acc_delta: list  # zeros


def adadelta(
    learning_rate=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False
) -> optax.GradientTransformation:
    """cstorch Adadelta.

    ``g = ±grad + wd·p``; ``sq = ρ·sq + (1-ρ)·g²``;
    ``δ = √(acc + eps)/√(sq + eps)·g``; ``acc = ρ·acc + (1-ρ)·δ²``; ``p ← p - lr·δ``.
    """

    def init(params):
        return AdadeltaState(_zeros_like(params), _zeros_like(params))

    def rule(g, p, s):
        g = _coupled_l2(_maximized(g, maximize), p, weight_decay)
        sq = _ema(s["square_avg"], g * g, rho)
        std = jnp.sqrt(sq + eps)
        delta = jnp.sqrt(s["acc_delta"] + eps) / std * g
        acc = _ema(s["acc_delta"], delta * delta, rho)
        return -learning_rate * delta, {"square_avg": sq, "acc_delta": acc}

    return _transformation(init, rule)


# ------------------------------------------------------------------------------ Adafactor
class AdafactorState(NamedTuple):
    exp_avg: list | None  # only with beta1 (which cstorch 2.10 rejects)
    exp_avg_sq_row: list | None  # shape[:-1] for ndim >= 2 params, None entries otherwise
    exp_avg_sq_col: list | None  # shape[:-2] + shape[-1:] for ndim >= 2 params
    exp_avg_sq: list | None  # zeros_like(p) for ndim < 2 params, None entries otherwise
    step: list  # 0-dim float32, incremented before use


def _rms(x):
    return jnp.sqrt(jnp.mean(jnp.square(x)))


def adafactor(
    learning_rate,
    eps=(1e-30, 1e-3),
    clip_threshold=1.0,
    decay_rate=-0.8,
    beta1=None,
    weight_decay=0.0,
    scale_parameter=True,
    relative_step=False,
    warmup_init=False,
) -> optax.GradientTransformation:
    """cstorch Adafactor (external learning rate only).

    ``t += 1``; ``lr_t = max(rms(p), eps[1])·lr`` (just ``lr`` without ``scale_parameter``);
    ``β2_t = 1 - t^decay_rate``; ``G = grad² + eps[0]``. For ``ndim >= 2``:
    ``row = β2_t·row + (1-β2_t)·mean_{-1}(G)``, ``col = β2_t·col + (1-β2_t)·mean_{-2}(G)``,
    ``u = rsqrt(row/mean(row))[..., None]·rsqrt(col)[..., None, :]·grad``; otherwise
    ``v = β2_t·v + (1-β2_t)·G`` and ``u = rsqrt(v)·grad``. Then
    ``u /= max(rms(u)/clip_threshold, 1)``, ``u *= lr_t``, (with ``beta1``:
    ``m = β1·m + (1-β1)·u``, ``u = m``), and ``p ← p - wd·lr_t·p - u``.

    ``relative_step`` (and so ``warmup_init``) is rejected, as in cstorch 2.10.
    """
    if relative_step:
        raise CstorchValueError(
            f"Adafactor relative_step=True is not supported, got {relative_step=}"
        )
    eps1, eps2 = eps[0], eps[1]
    use_first_moment = beta1 is not None
    del warmup_init  # only meaningful with relative_step

    def init(params):
        params = list(params)
        fac = [p.ndim >= 2 for p in params]
        return AdafactorState(
            exp_avg=_zeros_like(params) if use_first_moment else None,
            exp_avg_sq_row=(
                [jnp.zeros(p.shape[:-1], p.dtype) if f else None for p, f in zip(params, fac)]
                if any(fac)
                else None
            ),
            exp_avg_sq_col=(
                [
                    jnp.zeros(p.shape[:-2] + p.shape[-1:], p.dtype) if f else None
                    for p, f in zip(params, fac)
                ]
                if any(fac)
                else None
            ),
            exp_avg_sq=(
                [None if f else jnp.zeros_like(p) for p, f in zip(params, fac)]
                if not all(fac)
                else None
            ),
            step=_full_like_scalar(params, 0.0),
        )

    def rule(g, p, s):
        step = s["step"] + 1.0
        lr = jnp.maximum(_rms(p), _f32(eps2)) * learning_rate if scale_parameter else learning_rate
        beta2t = 1.0 - jnp.power(step, _f32(decay_rate))
        upd = g**2 + eps1
        new = {"step": step}
        if p.ndim >= 2:
            row = _ema(s["exp_avg_sq_row"], jnp.mean(upd, axis=-1), beta2t)
            col = _ema(s["exp_avg_sq_col"], jnp.mean(upd, axis=-2), beta2t)
            new.update(exp_avg_sq_row=row, exp_avg_sq_col=col)
            r = jax.lax.rsqrt(row / jnp.mean(row, axis=-1, keepdims=True))[..., None]
            c = jax.lax.rsqrt(col)[..., None, :]
            upd = r * c * g
        else:
            v = _ema(s["exp_avg_sq"], upd, beta2t)
            new["exp_avg_sq"] = v
            upd = jax.lax.rsqrt(v) * g
        upd = upd / jnp.maximum(_rms(upd) / clip_threshold, _f32(1.0))
        upd = upd * lr
        if use_first_moment:
            m = _ema(s["exp_avg"], upd, beta1)
            new["exp_avg"] = m
            upd = m
        new_p = p - p * (weight_decay * lr)
        new_p = new_p - upd
        return _delta(new_p, p), new

    return _transformation(init, rule)


# -------------------------------------------------------------------------------- Adagrad
class AdagradState(NamedTuple):
    sum: list  # full of initial_accumulator_value
    step: list  # 0-dim float32


def adagrad(
    learning_rate=1e-2,
    lr_decay=0.0,
    weight_decay=0.0,
    initial_accumulator_value=0.0,
    eps=1e-6,
    maximize=False,
) -> optax.GradientTransformation:
    """cstorch Adagrad.

    ``t += 1``; ``g = ±grad + wd·p``; ``sum += g²``;
    ``p ← p - lr·g/(1 + (t-1)·lr_decay)/(√sum + eps)``.
    """

    def init(params):
        return AdagradState(
            [jnp.full_like(p, initial_accumulator_value) for p in params],
            _full_like_scalar(params, 0.0),
        )

    def rule(g, p, s):
        step = s["step"] + 1.0
        g = _coupled_l2(_maximized(g, maximize), p, weight_decay)
        acc = s["sum"] + g * g
        std = jnp.sqrt(acc) + eps
        g = g / (1.0 + (step - 1.0) * lr_decay)
        return (-learning_rate * g) / std, {"sum": acc, "step": step}

    return _transformation(init, rule)


# --------------------------------------------------------------------------------- Adamax
class AdamaxState(NamedTuple):
    exp_avg: list
    exp_inf: list
    beta1_power: list  # 0-dim float32, starts at β1


def adamax(
    learning_rate=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, maximize=False
) -> optax.GradientTransformation:
    """cstorch Adamax.

    ``g = ±grad + wd·p``; ``m = β1·m + (1-β1)·g``; ``u = max(β2·u, |g| + eps)``;
    ``p ← p - lr·(m/u)/(1 - β1^t)`` with ``β1^t`` the stored ``beta1_power``.
    """
    beta1, beta2 = betas[0], betas[1]

    def init(params):
        return AdamaxState(
            _zeros_like(params), _zeros_like(params), _full_like_scalar(params, beta1)
        )

    def rule(g, p, s):
        g = _coupled_l2(_maximized(g, maximize), p, weight_decay)
        m = _ema(s["exp_avg"], g, beta1)
        u_inf = jnp.maximum(s["exp_inf"] * beta2, jnp.abs(g) + eps)
        upd = m / u_inf
        upd = upd / (1.0 - s["beta1_power"])
        upd = upd * learning_rate
        return -upd, {"exp_avg": m, "exp_inf": u_inf, "beta1_power": s["beta1_power"] * beta1}

    return _transformation(init, rule)


# ----------------------------------------------------------------------------------- ASGD
class ASGDState(NamedTuple):
    eta: list  # 0-dim float32, starts at lr
    mu: list  # 0-dim float32, starts at 1
    ax: list  # zeros
    step: list  # 0-dim float32


def asgd(
    learning_rate=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0, maximize=False
) -> optax.GradientTransformation:
    """cstorch ASGD (torch's single-tensor algorithm).

    ``t += 1``; ``g = ±grad + wd·p``; ``p ← p·(1 - λ·η) - η·g``;
    ``ax = p`` if ``μ == 1`` else ``ax + μ·(p - ax)``; then
    ``η = lr/(1 + λ·lr·t)^α`` and ``μ = 1/max(1, t - t0)``.
    """

    def init(params):
        return ASGDState(
            _full_like_scalar(params, learning_rate),
            _full_like_scalar(params, 1.0),
            _zeros_like(params),
            _full_like_scalar(params, 0.0),
        )

    def rule(g, p, s):
        eta, mu, ax = s["eta"], s["mu"], s["ax"]
        step = s["step"] + 1.0
        g = _coupled_l2(_maximized(g, maximize), p, weight_decay)
        new_p = p * (1 - lambd * eta)
        new_p = new_p + g * -eta
        new_ax = jnp.where(mu == 1, new_p, ax + (new_p - ax) * mu)
        new_eta = learning_rate / jnp.power(1 + lambd * learning_rate * step, _f32(alpha))
        new_mu = 1 / jnp.maximum(_f32(1.0), step - t0)
        return _delta(new_p, p), {"eta": new_eta, "mu": new_mu, "ax": new_ax, "step": step}

    return _transformation(init, rule)


# ----------------------------------------------------------------------------------- Lamb
class LambState(NamedTuple):
    exp_avg: list
    exp_avg_sq: list


def lamb(
    learning_rate=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, adam=False
) -> optax.GradientTransformation:
    """cstorch Lamb (paper v3: no bias correction).

    ``m = β1·m + (1-β1)·g``; ``v = β2·v + (1-β2)·g²``; ``a = m/(√v + eps) + wd·p``;
    ``r = clamp(‖p‖, 0, 10)/‖a‖``, or 1 if either norm is 0 or ``adam``; ``p ← p - lr·r·a``.
    """
    beta1, beta2 = betas[0], betas[1]

    def init(params):
        return LambState(_zeros_like(params), _zeros_like(params))

    def rule(g, p, s):
        m = _ema(s["exp_avg"], g, beta1)
        v = _ema(s["exp_avg_sq"], g * g, beta2)
        weight_norm = jnp.clip(jnp.sqrt(jnp.sum(p**2)), 0, 10).astype(_F32)
        step = m / (jnp.sqrt(v) + eps)
        step = step + p * weight_decay
        adam_norm = jnp.sqrt(jnp.sum(step**2)).astype(_F32)
        one = _f32(1.0)
        trust = jnp.where(
            weight_norm > 0, jnp.where(adam_norm > 0, weight_norm / adam_norm, one), one
        )
        if adam:
            trust = 1
        return -((step * trust) * learning_rate), {"exp_avg": m, "exp_avg_sq": v}

    return _transformation(init, rule)


# ----------------------------------------------------------------------------------- Lion
class LionState(NamedTuple):
    exp_avg: list


def lion(learning_rate=1e-4, betas=(0.9, 0.99), weight_decay=0.0) -> optax.GradientTransformation:
    """cstorch Lion.

    ``p ← p·(1 - lr·wd) - lr·sign(β1·m + (1-β1)·g)``; then ``m = β2·m + (1-β2)·g``.
    """
    beta1, beta2 = betas[0], betas[1]

    def init(params):
        return LionState(_zeros_like(params))

    def rule(g, p, s):
        m = s["exp_avg"]
        new_p = p * (1 - learning_rate * weight_decay)
        direction = jnp.sign(_ema(m, g, beta1))
        new_p = new_p + -learning_rate * direction
        return _delta(new_p, p), {"exp_avg": _ema(m, g, beta2)}

    return _transformation(init, rule)


# ----------------------------------------------------------------------------------- Muon
class MuonState(NamedTuple):
    momentum_buffer: list | None  # only if momentum != 0; zeros at init


_NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz5(G, steps=5):
    """Approximately orthogonalises ``G`` (``U S Vᵀ -> U Vᵀ``) over its last two dims.

    The quintic Newton–Schulz iteration of Muon, in bfloat16 like the reference: every op's
    result is rounded to bfloat16 and the matmuls accumulate in float32 (as torch on CPU does).
    ``X = G/(‖G‖_F + 1e-7)`` (transposed when rows > columns), then ``steps`` times
    ``A = X·Xᵀ``, ``B = b·A + (c·A)·A``, ``X = a·X + B·X`` with
    ``(a, b, c) = (3.4445, -4.7750, 2.0315)``.
    """
    if G.ndim < 2:
        raise CstorchValueError(f"G has {G.ndim} dimensions. Requires G has 2 or more dimensions")
    a, b, c = _NS_COEFFS
    bf16 = jnp.bfloat16

    def r(x):  # round an op's float32 result to bfloat16
        return x.astype(bf16)

    def mm(x, y):
        return r(jnp.matmul(x, y, preferred_element_type=_F32))

    def f(x):
        return x.astype(_F32)

    X = G.astype(bf16)
    transpose = G.shape[-2] > G.shape[-1]
    if transpose:
        X = jnp.swapaxes(X, -1, -2)
    norm = r(jnp.sqrt(jnp.sum(jnp.square(f(X)), axis=(-2, -1), keepdims=True)))
    X = r(f(X) / f(r(f(norm) + 1e-7)))

    def body(_, X):
        A = mm(X, jnp.swapaxes(X, -1, -2))
        B = r(f(r(b * f(A))) + f(mm(r(c * f(A)), A)))
        return r(f(r(a * f(X))) + f(mm(B, X)))

    if isinstance(steps, int):
        for _ in range(steps):
            X = body(None, X)
    else:  # a traced ns_steps (e.g. under inject_hyperparams)
        X = jax.lax.fori_loop(0, steps, body, X)
    if transpose:
        X = jnp.swapaxes(X, -1, -2)
    return X


def muon(
    learning_rate=0.02, weight_decay=0.01, momentum=0.95, nesterov=True, ns_steps=5
) -> optax.GradientTransformation:
    """cstorch Muon: momentum SGD whose direction is orthogonalised by Newton–Schulz.

    ``buf = μ·buf + (1-μ)·g``; ``d = g + μ·buf`` (Nesterov) or ``buf``; 4-d ``d`` is viewed as
    ``(shape[0], -1)``; ``O = newton_schulz5(d, ns_steps)`` (bfloat16);
    ``lr' = lr·0.2·√max(shape[0], shape[1])``; ``p ← p·(1 - lr'·wd) - lr'·O`` (the product
    ``lr'·O`` is rounded to bfloat16, as in the reference).

    Parameters with fewer than 2 dims raise ValueError at update, as the reference's
    Newton–Schulz step does: give them to another optimizer.

    Differs from cerebras-pytorch 2.10: off CSX the reference's ``step`` raises TypeError (its
    Newton–Schulz helper lacks ``self``) and it never writes the momentum buffer back, so the
    buffer stays at zero; on CSX it runs a single Newton–Schulz step whatever ``ns_steps``.
    Here the update is the one the reference's formula describes, with ``ns_steps`` iterations
    and the buffer persisted in the state.
    """

    def init(params):
        return MuonState(_zeros_like(params) if _is_on(momentum) else None)

    def rule(g, p, s):
        if p.ndim < 2:
            raise CstorchValueError(
                f"Muon needs parameters with 2 or more dimensions, got shape {p.shape}; "
                "optimize 0-d/1-d parameters with another optimizer"
            )
        buf_old = s["momentum_buffer"]
        if buf_old is None:
            buf_old = jnp.zeros_like(g)
        buf = buf_old * momentum + g * (1 - momentum)
        d = g + buf * momentum if nesterov else buf
        if d.ndim == 4:
            d = d.reshape(d.shape[0], -1)
        ortho = newton_schulz5(d, ns_steps).reshape(p.shape)
        A, B = p.shape[:2]
        adjusted_lr = learning_rate * (0.2 * max(A, B) ** 0.5)
        new_p = p * (1 - adjusted_lr * weight_decay)
        step = (-adjusted_lr * ortho.astype(_F32)).astype(jnp.bfloat16)
        new_p = new_p + step.astype(new_p.dtype)
        new = {} if s["momentum_buffer"] is None else {"momentum_buffer": buf}
        return _delta(new_p, p), new

    return _transformation(init, rule)


# ---------------------------------------------------------------------------------- NAdam
class NAdamState(NamedTuple):
    mu_product: list  # 0-dim float32, starts at 1
    exp_avg: list
    exp_avg_sq: list
    step: list  # 0-dim float32


def nadam(
    learning_rate=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3
) -> optax.GradientTransformation:
    """cstorch NAdam (torch's algorithm with ``μ_t = β1·(1 - ½·0.96^(t·ψ))``).

    ``t += 1``; ``g = grad + wd·p``; ``Π ← Π·μ_t``; ``m = β1·m + (1-β1)·g``;
    ``v = β2·v + (1-β2)·g²``;
    ``p ← p - lr·(μ_{t+1}·m/(1 - Π·μ_t·μ_{t+1}) + (1-μ_t)·g/(1 - Π))/(√(v/(1-β2^t)) + eps)``
    (``Π`` already updated). As in the reference, the momentum term's denominator is
    ``1 - Π·μ_t·μ_{t+1}`` with ``μ_t`` counted twice; torch's NAdam uses ``1 - Π·μ_{t+1}``.
    """
    beta1, beta2 = betas[0], betas[1]

    def init(params):
        return NAdamState(
            _full_like_scalar(params, 1.0),
            _zeros_like(params),
            _zeros_like(params),
            _full_like_scalar(params, 0.0),
        )

    def rule(g, p, s):
        b2 = _f32(beta2)
        step = s["step"] + 1.0
        bias_correction2 = 1 - jnp.power(b2, step)
        g = _coupled_l2(g, p, weight_decay)
        c096 = _f32(0.96)
        mu = beta1 * (1.0 - 0.5 * jnp.power(c096, step * momentum_decay))
        mu_next = beta1 * (1.0 - 0.5 * jnp.power(c096, (step + 1) * momentum_decay))
        mu_product = s["mu_product"] * mu
        mu_product_next = mu_product * mu * mu_next
        m = _ema(s["exp_avg"], g, beta1)
        v = _ema(s["exp_avg_sq"], g * g, b2)
        denom = jnp.sqrt(v / bias_correction2) + eps
        upd = (mu_next * m) / (1.0 - mu_product_next) + (g * (1.0 - mu)) / (1.0 - mu_product)
        upd = upd * -learning_rate
        return upd / denom, {"mu_product": mu_product, "exp_avg": m, "exp_avg_sq": v, "step": step}

    return _transformation(init, rule)


# ---------------------------------------------------------------------------------- RAdam
class RAdamState(NamedTuple):
    exp_avg: list
    exp_avg_sq: list
    step: list  # 0-dim float32


def radam(
    learning_rate=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0
) -> optax.GradientTransformation:
    """cstorch RAdam.

    ``t += 1``; ``g = grad + wd·p``; ``m``, ``v`` as Adam; ``ρ∞ = 2/(1-β2) - 1``,
    ``ρ_t = ρ∞ - 2t·β2^t/(1-β2^t)``; if ``ρ_t > 5``:
    ``p ← p - lr·m/(1-β1^t)·r_t·√(1-β2^t)/(√v + eps)`` with
    ``r_t = √((ρ_t-4)(ρ_t-2)ρ∞/((ρ∞-4)(ρ∞-2)ρ_t))``, else ``p ← p - lr·m/(1-β1^t)``.
    """

    def init(params):
        return RAdamState(_zeros_like(params), _zeros_like(params), _full_like_scalar(params, 0.0))

    def rule(g, p, s):
        b1, b2 = _f32(betas[0]), _f32(betas[1])
        step = s["step"] + 1.0
        g = _coupled_l2(g, p, weight_decay)
        beta2t = jnp.power(b2, step)
        bias_correction1 = 1 - jnp.power(b1, step)
        bias_correction2 = 1 - beta2t
        m = _ema(s["exp_avg"], g, b1)
        v = _ema(s["exp_avg_sq"], g * g, b2)
        upd = m / bias_correction1
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 * step * beta2t / bias_correction2
        one = _f32(1.0)
        rectify = rho_t > 5.0
        rect = jnp.where(
            rectify,
            jnp.sqrt(
                (rho_t - 4.0)
                * (rho_t - 2.0)
                * rho_inf
                / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t)
            ),
            one,
        )
        adaptive = jnp.where(rectify, jnp.sqrt(bias_correction2) / (jnp.sqrt(v) + eps), one)
        upd = upd * rect * adaptive * learning_rate
        return -upd, {"exp_avg": m, "exp_avg_sq": v, "step": step}

    return _transformation(init, rule)


# -------------------------------------------------------------------------------- RMSprop
class RMSpropState(NamedTuple):
    square_avg: list
    momentum_buffer: list | None  # only if momentum > 0
    grad_avg: list | None  # only if centered


def rmsprop(
    learning_rate=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False
) -> optax.GradientTransformation:
    """cstorch RMSprop.

    ``g = grad + wd·p``; ``sq = α·sq + (1-α)·g²``; ``avg = √(sq - ḡ²) + eps`` with
    ``ḡ = α·ḡ + (1-α)·g`` if ``centered``, else ``√sq + eps``; with momentum
    ``buf = μ·buf + g/avg`` and ``p ← p - lr·buf``, else ``p ← p - lr·g/avg``.
    """

    def init(params):
        return RMSpropState(
            _zeros_like(params),
            _zeros_like(params) if _is_on(momentum) else None,
            _zeros_like(params) if centered else None,
        )

    def rule(g, p, s):
        g = _coupled_l2(g, p, weight_decay)
        sq = _ema(s["square_avg"], g * g, alpha)
        new = {"square_avg": sq}
        if s["grad_avg"] is not None:
            ga = _ema(s["grad_avg"], g, alpha)
            new["grad_avg"] = ga
            avg = jnp.sqrt(sq - ga * ga) + eps
        else:
            avg = jnp.sqrt(sq) + eps
        if s["momentum_buffer"] is not None:
            buf = s["momentum_buffer"] * momentum + g / avg
            new["momentum_buffer"] = buf
            return -learning_rate * buf, new
        return (-learning_rate * g) / avg, new

    return _transformation(init, rule)


# ---------------------------------------------------------------------------------- Rprop
class RpropState(NamedTuple):
    prev: list  # zeros
    step_size: list  # full of lr at init


def rprop(
    learning_rate=1e-3, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0)
) -> optax.GradientTransformation:
    """cstorch Rprop.

    ``s = g·prev``; factor ``η+`` where ``s > 0``, ``η-`` where ``s < 0``, else 1;
    ``step_size = clamp(step_size·factor, min, max)``; ``g = 0`` where the factor is ``η-``;
    ``p ← p - sign(g)·step_size``; ``prev = g``. ``learning_rate`` only sets the initial
    step size.
    """

    def init(params):
        return RpropState(_zeros_like(params), [jnp.full_like(p, learning_rate) for p in params])

    def rule(g, p, s):
        etaminus, etaplus = _f32(etas[0]), _f32(etas[1])
        size_min, size_max = _f32(step_sizes[0]), _f32(step_sizes[1])
        zero, one = _f32(0.0), _f32(1.0)
        factor = g * s["prev"]
        factor = jnp.where(factor > zero, etaplus, factor)
        factor = jnp.where(factor < zero, etaminus, factor)
        factor = jnp.where(factor == zero, one, factor)
        size = jnp.clip(s["step_size"] * factor, size_min, size_max)
        g = g * jnp.where(factor == etaminus, zero, one)
        sign = jnp.where(g > zero, one, jnp.where(g < zero, -one, zero))
        return -(sign * size), {"prev": g, "step_size": size}

    return _transformation(init, rule)


# ------------------------------------------------------------------------------- registry
OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "sgd": sgd,
    "adam_base": adam_base,
    "adam": adam,
    "adamw": adamw,
    "adadelta": adadelta,
    "adafactor": adafactor,
    "adagrad": adagrad,
    "adamax": adamax,
    "asgd": asgd,
    "lamb": lamb,
    "lion": lion,
    "muon": muon,
    "nadam": nadam,
    "radam": radam,
    "rmsprop": rmsprop,
    "rprop": rprop,
}


def build(name: str, hyperparams: dict) -> optax.GradientTransformation:
    try:
        factory = OPTIMIZERS[name]
    except KeyError:
        raise CstorchValueError(
            f"unknown optimizer {name!r}; known: {sorted(OPTIMIZERS)}"
        ) from None
    return factory(**hyperparams)


def apply(name: str, hyperparams: dict, params, grads, state_leaves, treedef=None):
    """One update of the named optimizer on flat lists; returns (new_params, new_state_leaves).

    ``state_leaves`` are the state's leaves in ``jax.tree.leaves`` order: field by field, each
    field one array per parameter (Adafactor's ``None`` entries have no leaf). ``treedef`` is
    the state's structure when the caller knows it (``torch_ops.state_layout`` caches it);
    by default it is derived from ``init``.
    """
    tx = build(name, hyperparams)
    if treedef is None:
        treedef = jax.tree.structure(jax.eval_shape(tx.init, list(params)))
    state = jax.tree.unflatten(treedef, list(state_leaves))
    updates, new_state = tx.update(list(grads), state, list(params))
    new_params = optax.apply_updates(list(params), updates)
    return list(new_params), jax.tree.leaves(new_state)


def init_state(name: str, hyperparams: dict, params) -> dict:
    """Initial state as ``{torch_key: [one array per param]}`` (``None`` entries where a key
    does not apply to a parameter, see ``param_state_keys``)."""
    return state_dict(build(name, hyperparams).init(list(params)))


def state_dict(state) -> dict:
    """A state NamedTuple as ``{torch_key: [one array per param]}`` (see ``init_state``)."""
    return {key: getattr(state, key) for key in state_keys(state)}
