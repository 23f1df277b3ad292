"""Schedules as pure functions of the step count, in the closed forms of cerebras-pytorch 2.10.

Each factory checks its arguments (``ValueError`` quoting the bad value) and returns
``count -> value``, a float32 scalar, usable directly as an optax schedule. ``count`` is the
scheduler's ``last_epoch`` (0 right after construction, +1 per ``scheduler.step()``); it may be a
Python int or a traced integer array, and no schedule branches in Python on it. Values are
computed in float32 in the reference's order of operations. ``from_config`` rebuilds a
schedule from the JSON-able dict ``{"kind": name, **arguments}`` a ``cstorch`` scheduler
describes itself with (composites nest their children's configs under ``"schedules"``); that is
how a traced step carries a schedule.

Kinds and their arguments (``initial`` is the reference's ``initial_val`` /
``initial_learning_rate``, ``end`` its ``end_val``):

=================================  ===========================================================
``constant``                       ``value``
``polynomial``                     ``initial, end, total_iters, power=1.0, cycle=False``
``linear``                         ``initial, end, total_iters, cycle=False``
``exponential``                    ``initial, total_iters, decay_rate, staircase=False``
``inverse_exponential_time_decay`` ``initial, step_exponent, total_iters, decay_rate,
                                   staircase=False``
``inverse_square_root_decay``      ``initial=1.0, scale=1.0, warmup_steps=1.0``
``cosine_decay``                   ``initial, end, total_iters``
``sequential``                     ``schedules, milestones``
``piecewise_constant``             ``values, milestones``
``multi_step``                     ``initial, gamma, milestones``
``step``                           ``initial, step_size, gamma``
``cosine_annealing``               ``initial, T_max, eta_min=0.0``
``lambda``                         ``initial, fn`` (``fn``: a name from ``LAMBDAS`` or a list of
                                   names; callables when built in Python)
``cosine_annealing_warm_restarts`` ``initial, T_0, T_mult=1, eta_min=0.0``
``multiplicative``                 ``initial, coefficient``
``chained``                        ``schedules`` (each child's ``initial`` is read from its
                                   config), or ``schedules, initials``
``cyclic``                         ``base, max_value, step_size_up=2000, step_size_down=None,
                                   mode="triangular", gamma=1.0, scale_mode="cycle"``
``one_cycle``                      ``initial, max_value, total_steps=1000, pct_start=0.3,
                                   final_div_factor=1e4, three_phase=False,
                                   anneal_strategy="cos"``
``scaled``                         ``schedules`` (one child), ``factor``
=================================  ===========================================================

>>> f = linear(1.0, 0.0, total_iters=10)
>>> float(f(5)), float(f(12))
(0.5, 0.0)
>>> g = from_config({"kind": "sequential", "milestones": [2], "schedules": [
...     {"kind": "constant", "value": 0.5}, {"kind": "step", "initial": 1.0, "step_size": 2,
...     "gamma": 0.5}]})
>>> [float(g(t)) for t in range(6)]
[0.5, 0.5, 1.0, 1.0, 0.5, 0.5]
"""

from __future__ import annotations

import math
import numbers
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from jax_backend.errors import CstorchTypeError, CstorchValueError

Schedule = Callable[[object], jnp.ndarray]
_F32 = jnp.float32


def _t(count):
    return jnp.asarray(count)


def _tf(count):
    return jnp.asarray(count).astype(_F32)


def _f(value):
    return jnp.asarray(value, _F32)


def _pow(x, exponent):
    """``x ** exponent`` for a Python exponent (integer exponents by repeated products)."""
    if float(exponent).is_integer() and abs(exponent) < 2**31:
        return x ** int(exponent)
    return x ** _f(exponent)


def _is_int(value) -> bool:
    return (
        isinstance(value, numbers.Integral)
        and not isinstance(value, bool)
        or (isinstance(value, float) and value.is_integer())
    )


def _floor_div(count, divisor):
    """``floor(t/divisor)`` as float32, exact for integer counts and divisors (XLA's compiled
    float division may be off by an ulp, which would move a floor or ceil across an integer)."""
    t = _t(count)
    if jnp.issubdtype(t.dtype, jnp.integer) and _is_int(divisor):
        return jnp.floor_divide(t, int(divisor)).astype(_F32)
    return jnp.floor(t.astype(_F32) / _f(divisor))


def _ceil_div(count, divisor):
    """``ceil(t/divisor)`` as float32, exact for integer counts and divisors."""
    t = _t(count)
    if jnp.issubdtype(t.dtype, jnp.integer) and _is_int(divisor):
        return (-jnp.floor_divide(-t, int(divisor))).astype(_F32)
    return jnp.ceil(t.astype(_F32) / _f(divisor))


def _check_positive(name, value, kind):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value > 0:
        raise CstorchValueError(f"{kind} needs {name} > 0, got {name}={value!r}")


def _check_int_list(name, values, kind):
    values = list(values)
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in values):
        raise CstorchTypeError(f"{kind} expects {name} to be a list of integers, got {values!r}")
    return [int(v) for v in values]


# ---------------------------------------------------------------------------------- basic
def constant(value: float) -> Schedule:
    """``value`` at every step (``ConstantLR``)."""

    def schedule(count):
        del count
        return _f(value)

    return schedule


def polynomial(
    initial: float, end: float, total_iters: int, power: float = 1.0, cycle: bool = False
) -> Schedule:
    """``PolynomialLR``: ``end`` once ``t >= T``, else ``(initial-end)·(1-t/T)^power + end``.

    With ``cycle`` the decay restarts every ``T`` steps over a growing horizon, as in
    TF/Keras ``PolynomialDecay(cycle=True)``: ``T_t = T·ceil(t/T)`` (``t = 0`` counts as 1) and
    ``(initial-end)·(1-t/T_t)^power + end`` with no clamp.

    Differs from cerebras-pytorch 2.10: there ``cycle=True`` has no effect (its clamp to
    ``end`` for ``t >= T`` comes first).
    """
    _check_positive("total_iters", total_iters, "polynomial")
    diff = initial - end

    if cycle:

        def cyclic_schedule(count):
            tf = _tf(count)
            multiplier = jnp.where(tf == 0, _f(1.0), _ceil_div(count, total_iters))
            decay_steps = _f(total_iters) * multiplier
            value = _pow(1.0 - tf / decay_steps, power) * _f(diff) + _f(end)
            return value.astype(_F32)

        return cyclic_schedule

    def schedule(count):
        t = _t(count)
        decayed = _pow(1.0 - t.astype(_F32) / _f(total_iters), power) * _f(diff) + _f(end)
        return jnp.where(t >= total_iters, _f(end), decayed.astype(_F32))

    return schedule


def linear(initial: float, end: float, total_iters: int, cycle: bool = False) -> Schedule:
    """``LinearLR``: ``polynomial`` with ``power=1``."""
    return polynomial(initial, end, total_iters, 1.0, cycle)


def exponential(
    initial: float, total_iters: int, decay_rate: float, staircase: bool = False
) -> Schedule:
    """``ExponentialLR``: ``initial·decay_rate^(t/T)`` (``floor(t/T)`` with ``staircase``)."""
    _check_positive("total_iters", total_iters, "exponential")

    def schedule(count):
        power = _floor_div(count, total_iters) if staircase else _tf(count) / _f(total_iters)
        return (jnp.power(_f(decay_rate), power) * _f(initial)).astype(_F32)

    return schedule


def inverse_exponential_time_decay(
    initial: float,
    step_exponent: float,
    total_iters: int,
    decay_rate: float,
    staircase: bool = False,
) -> Schedule:
    """``InverseExponentialTimeDecayLR``: ``initial/(1 + decay_rate·a)`` with
    ``a = t^step_exponent/T`` (``floor(a)`` with ``staircase``)."""
    _check_positive("total_iters", total_iters, "inverse_exponential_time_decay")

    def schedule(count):
        t = _t(count)
        if staircase and _is_int(step_exponent) and step_exponent >= 0:
            alpha = _floor_div(t ** int(step_exponent), total_iters)
        else:
            alpha = _pow(t.astype(_F32), step_exponent) / _f(total_iters)
            if staircase:
                alpha = jnp.floor(alpha)
        return (_f(initial) / (alpha * _f(decay_rate) + 1.0)).astype(_F32)

    return schedule


def inverse_square_root_decay(
    initial: float = 1.0, scale: float = 1.0, warmup_steps: float = 1.0
) -> Schedule:
    """``InverseSquareRootDecayLR``: ``initial·scale/√max(warmup_steps, t)``."""
    _check_positive("warmup_steps", warmup_steps, "inverse_square_root_decay")

    def schedule(count):
        value = _f(scale) / jnp.sqrt(jnp.maximum(_f(warmup_steps), _tf(count)))
        return (value * _f(initial)).astype(_F32)

    return schedule


def cosine_decay(initial: float, end: float, total_iters: int) -> Schedule:
    """``CosineDecayLR``: ``end + (initial-end)·½(1+cos(π·min(t,T)/T))``."""
    _check_positive("total_iters", total_iters, "cosine_decay")
    diff = initial - end

    def schedule(count):
        step = jnp.minimum(_f(total_iters), _tf(count))
        progress = (jnp.cos(_f(math.pi) / _f(total_iters) * step) + 1.0) * 0.5
        return (progress * _f(diff) + _f(end)).astype(_F32)

    return schedule


def multi_step(initial: float, gamma: float, milestones: Sequence[int]) -> Schedule:
    """``MultiStepLR``: ``initial·γ^(number of milestones <= t)``."""
    milestones = _check_int_list("milestones", milestones, "multi_step")

    def schedule(count):
        t = _t(count)
        value = _f(initial)
        for milestone in milestones:
            value = jnp.where(t < milestone, value, _f(gamma) * value)
        return value

    return schedule


def step(initial: float, step_size: int, gamma: float) -> Schedule:
    """``StepLR``: ``initial·γ^floor(t/step_size)``."""
    _check_positive("step_size", step_size, "step")

    def schedule(count):
        exponent = _floor_div(count, step_size)
        return (jnp.power(_f(gamma), exponent) * _f(initial)).astype(_F32)

    return schedule


def cosine_annealing(initial: float, T_max: int, eta_min: float = 0.0) -> Schedule:
    """``CosineAnnealingLR``: ``η_min + (initial-η_min)·(1 + cos(π·t/T_max))/2``, periodic
    (no clamp at ``T_max``)."""
    _check_positive("T_max", T_max, "cosine_annealing")
    diff = initial - eta_min

    def schedule(count):
        a = (jnp.cos(_tf(count) / _f(T_max) * _f(math.pi)) + 1.0) / 2.0
        return (a * _f(diff) + _f(eta_min)).astype(_F32)

    return schedule


def cosine_annealing_warm_restarts(
    initial: float, T_0: int, T_mult: int = 1, eta_min: float = 0.0
) -> Schedule:
    """``CosineAnnealingWarmRestarts`` (SGDR with ``T_mult = 1``):
    ``η_min + (initial-η_min)·(1 + cos(π·T_cur/T_0))/2`` with ``T_cur = t mod T_0``.

    Differs from cerebras-pytorch 2.10: from the second period on the reference uses
    ``T_cur = (floor(t/T_0) - 1)·T_0``, a multiple of ``T_0``, so its values are piecewise
    constant (``initial`` on ``[T_0, 2T_0)``, ``η_min`` on ``[2T_0, 3T_0)``, ...). Here every
    period restarts the cosine, as SGDR and torch do. ``T_mult != 1`` is rejected, as in the
    reference.
    """
    _check_positive("T_0", T_0, "cosine_annealing_warm_restarts")
    if T_mult != 1:
        raise CstorchValueError(
            f"cosine_annealing_warm_restarts only supports T_mult=1, got {T_mult=}"
        )
    diff = initial - eta_min

    def schedule(count):
        t = _t(count)
        if jnp.issubdtype(t.dtype, jnp.integer) and _is_int(T_0):
            t_cur = jnp.remainder(t, int(T_0)).astype(_F32)
        else:
            t_cur = _tf(t) - _floor_div(t, T_0) * _f(T_0)
        a = (jnp.cos(t_cur / _f(T_0) * _f(math.pi)) + 1.0) / 2.0
        return (a * _f(diff) + _f(eta_min)).astype(_F32)

    return schedule


def multiplicative(initial: float, coefficient: float) -> Schedule:
    """``MultiplicativeLR``: ``initial·coefficient^t``."""

    def schedule(count):
        return (jnp.power(_f(coefficient), _tf(count)) * _f(initial)).astype(_F32)

    return schedule


# ------------------------------------------------------------------------------- lambdas
def _default_lambda_1(count):
    return _tf(count) / 30.0


def _default_lambda_2(count):
    return jnp.power(_f(0.95), _tf(count))


LAMBDAS: dict[str, Callable[[object], object]] = {
    "epoch_div_30": _default_lambda_1,
    "pow_0.95": _default_lambda_2,
}
"""Named factor functions for ``lambda`` configs (a config cannot carry a Python callable).
``"default"`` in a config means the reference's built-in pair ``["epoch_div_30", "pow_0.95"]``."""


def register_lambda(name: str, fn: Callable[[object], object]) -> None:
    """Makes ``fn`` (``count -> factor``, jittable) usable as ``{"kind": "lambda", "fn": name}``."""
    if not callable(fn):
        raise CstorchValueError(f"register_lambda needs a callable, got {fn!r}")
    LAMBDAS[name] = fn


def _resolve_lambdas(fn):
    if fn == "default":
        fn = ["epoch_div_30", "pow_0.95"]
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    out = []
    for f in fns:
        if isinstance(f, str):
            if f not in LAMBDAS:
                raise CstorchValueError(f"unknown lambda {f!r}; known: {sorted(LAMBDAS)}")
            f = LAMBDAS[f]
        if not callable(f):
            raise CstorchValueError(f"lambda schedule needs callables or names, got {f!r}")
        out.append(f)
    if not out:
        raise CstorchValueError(f"lambda schedule needs at least one function, got {fn!r}")
    return out


def lambda_schedule(initial: float, fn) -> Schedule:
    """``LambdaLR``: ``initial·Π_i fn_i(t)`` for a function ``fn(count) -> factor`` or a list
    of them (or names registered in ``LAMBDAS``; ``"default"`` is the reference's built-in
    ``[t/30, 0.95^t]``).

    Differs from cerebras-pytorch 2.10: the reference multiplies ``initial`` in once per
    function, ``Π_i (initial·fn_i(t))``, so its default pair gives ``initial²·(t/30)·0.95^t``.
    Here ``initial`` is applied once, so the default pair gives ``initial·(t/30)·0.95^t``.
    """
    fns = _resolve_lambdas(fn)

    def schedule(count):
        t = _t(count)
        factor = _f(1.0)
        for f in fns:
            # Registered lambdas are user code written for NumPy's promotion rules
            # (``1.0 / (1 + count)``); they keep them even if the caller made JAX strict.
            with jax.numpy_dtype_promotion("standard"):
                value = f(t)
            factor = jnp.asarray(value).astype(_F32) * factor
        return (_f(initial) * factor).astype(_F32)

    return schedule


# ----------------------------------------------------------------------------- composites
def sequential(schedules: Sequence[Schedule], milestones: Sequence[int]) -> Schedule:
    """``SequentialLR``: ``schedules[k](t - milestones[k-1])`` for
    ``milestones[k-1] <= t < milestones[k]`` (each child's count restarts at 0)."""
    milestones = _check_int_list("milestones", milestones, "sequential")
    if len(milestones) != len(schedules) - 1:
        raise CstorchValueError(
            f"sequential needs one milestone fewer than schedules, got {len(schedules)} "
            f"schedules and {len(milestones)} milestones"
        )

    def schedule(count):
        t = _t(count)
        value = schedules[0](t)
        for milestone, child in zip(milestones, schedules[1:]):
            value = jnp.where(t < milestone, value, child(jnp.maximum(t - milestone, 0)))
        return value

    return schedule


def piecewise_constant(values: Sequence[float], milestones: Sequence[int]) -> Schedule:
    """``PiecewiseConstantLR``: ``values[k]`` on ``[milestones[k-1], milestones[k])``, and
    ``values[-1]`` from the last milestone on. ``len(values)`` is ``len(milestones) + 1`` (or
    ``len(milestones)``, then the last value also holds after the last milestone, as the
    reference's construction gives)."""
    milestones = _check_int_list("milestones", milestones, "piecewise_constant")
    values = list(values)
    if len(values) not in (len(milestones), len(milestones) + 1) or not values:
        raise CstorchValueError(
            f"piecewise_constant needs len(milestones)+1 values, got {values=} for {milestones=}"
        )
    values = values[: len(milestones)] + [values[-1]]
    return sequential([constant(v) for v in values], milestones)


def chained(schedules: Sequence[Schedule], initials: Sequence[float]) -> Schedule:
    """``ChainedScheduler``: ``s_0(t)·Π_{i>=1} s_i(t)/initials[i-1]``.

    ``initials`` holds the initial value (the ``initial`` argument) of each schedule after the
    first, one fewer than ``schedules``; all children see the same count.
    """
    schedules, initials = list(schedules), list(initials)
    if not schedules:
        raise CstorchValueError("chained needs at least one schedule, got []")
    if len(initials) != len(schedules) - 1:
        raise CstorchValueError(
            f"chained needs the initial value of every schedule after the first, "
            f"got {initials=} for {len(schedules)} schedules"
        )
    for initial in initials:
        if initial == 0:
            raise CstorchValueError(
                f"chained divides by the children's initial values, got {initials=}"
            )

    def schedule(count):
        t = _t(count)
        value = schedules[0](t)
        for child, initial in zip(schedules[1:], initials):
            value = value * (child(t) / _f(initial))
        return jnp.asarray(value).astype(_F32)

    return schedule


def scaled(schedule: Schedule, factor: float) -> Schedule:
    """``schedule(t)·factor``: what ``ScalePerParamLR`` applies to a param group whose
    ``adjust_learning_rate`` is ``factor``."""

    def scaled_schedule(count):
        return (jnp.asarray(schedule(count)) * factor).astype(_F32)

    return scaled_schedule


# --------------------------------------------------------------------------------- cycles
def cyclic(
    base: float,
    max_value: float,
    step_size_up: int = 2000,
    step_size_down: int | None = None,
    mode: str = "triangular",
    gamma: float = 1.0,
    scale_mode: str = "cycle",
) -> Schedule:
    """``CyclicLR`` (CLR): a triangle from ``base`` up to ``max_value`` in ``step_size_up``
    steps and back in ``step_size_down`` (default: ``step_size_up``).

    ``c = floor(1 + t/S)``, ``x = t/S - c + 1`` (``S`` the cycle length, ``r = up/S``),
    ``h = (x/r if x <= r else (x-1)/(r-1))·(max_value-base)``; ``triangular``: ``base + h``;
    ``triangular2``: ``base + h/2^(c-1)``; any other mode is ``exp_range``:
    ``base + h·γ^t``. ``scale_mode`` is ignored: the mode decides it, as in the reference.
    """
    del scale_mode
    _check_positive("step_size_up", step_size_up, "cyclic")
    if step_size_down is None:
        step_size_down = step_size_up
    _check_positive("step_size_down", step_size_down, "cyclic")
    total = step_size_up + step_size_down
    ratio = step_size_up / total
    height = max_value - base

    def schedule(count):
        tf = _tf(count)
        cycle = _floor_div(count, total) + 1.0
        x = tf / _f(total) - cycle + 1.0
        factor = jnp.where(x <= _f(ratio), x / _f(ratio), (x - 1.0) / (_f(ratio) - 1.0))
        h = factor * _f(height)
        if mode == "triangular":
            scale = _f(1.0)
        elif mode == "triangular2":
            scale = _f(1.0) / jnp.power(_f(2.0), cycle - 1.0)
        else:
            scale = jnp.power(_f(gamma), tf)
        return (h * scale + _f(base)).astype(_F32)

    return schedule


def one_cycle(
    initial: float,
    max_value: float,
    total_steps: int = 1000,
    pct_start: float = 0.3,
    final_div_factor: float = 1e4,
    three_phase: bool = False,
    anneal_strategy: str = "cos",
) -> Schedule:
    """``OneCycleLR``: anneal ``initial -> max_value`` until step ``pct_start·N - 1``, then
    ``max_value -> initial/final_div_factor`` until ``N - 1`` (three phases:
    ``initial -> max_value -> initial -> initial/final_div_factor`` with ends
    ``pct·N - 1``, ``2·pct·N - 2``, ``N - 1``).

    A phase from ``a`` to ``b`` over ``[s, e]`` is ``b + (a-b)·(1+cos(π·p))/2`` (``"cos"``) or
    ``a + (b-a)·p`` (any other strategy), ``p = (t-s)/(e-s)``; after ``N - 1`` the last
    phase's formula simply continues, as in the reference.
    """
    _check_positive("total_steps", total_steps, "one_cycle")
    _check_positive("final_div_factor", final_div_factor, "one_cycle")
    min_value = initial / final_div_factor
    if three_phase:
        ends = [pct_start * total_steps - 1, 2 * pct_start * total_steps - 2, total_steps - 1]
        starts_v, ends_v = [initial, max_value, initial], [max_value, initial, min_value]
    else:
        ends = [pct_start * total_steps - 1, total_steps - 1]
        starts_v, ends_v = [initial, max_value], [max_value, min_value]
    bounds = [0] + ends
    if any(not b1 > b0 for b0, b1 in zip(bounds, bounds[1:])):
        raise CstorchValueError(
            f"one_cycle phases must have positive lengths, got phase ends {ends} "
            f"for {total_steps=}, {pct_start=}, {three_phase=}"
        )

    def anneal(a, b, pct):
        if anneal_strategy == "cos":
            return (jnp.cos(pct * _f(math.pi)) + 1.0) * _f((a - b) / 2.0) + _f(b)
        return pct * _f(b - a) + _f(a)

    def schedule(count):
        t = _t(count)
        tf = t.astype(_F32)
        value = anneal(starts_v[0], ends_v[0], tf / _f(ends[0]))
        start = ends[0]
        for k, end in enumerate(ends[1:]):
            pct = (tf - _f(start)) / _f(end - start)
            # t is an integer step and the phase end a Python float: t > end exactly when
            # t > floor(end), compared in t's own integer type (no float64, which a JAX
            # user's process does not have).
            threshold = math.floor(ends[k]) if jnp.issubdtype(t.dtype, jnp.integer) else ends[k]
            past = t > jnp.asarray(threshold, t.dtype)
            value = jnp.where(past, anneal(starts_v[k + 1], ends_v[k + 1], pct), value)
            start = end
        return value.astype(_F32)

    return schedule


# ------------------------------------------------------------------------------ configs
_FACTORIES: dict[str, Callable[..., Schedule]] = {
    "constant": constant,
    "polynomial": polynomial,
    "linear": linear,
    "exponential": exponential,
    "inverse_exponential_time_decay": inverse_exponential_time_decay,
    "inverse_square_root_decay": inverse_square_root_decay,
    "cosine_decay": cosine_decay,
    "piecewise_constant": piecewise_constant,
    "multi_step": multi_step,
    "step": step,
    "cosine_annealing": cosine_annealing,
    "lambda": lambda_schedule,
    "cosine_annealing_warm_restarts": cosine_annealing_warm_restarts,
    "multiplicative": multiplicative,
    "cyclic": cyclic,
    "one_cycle": one_cycle,
}
_COMPOSITES = ("sequential", "chained", "scaled")
KINDS = tuple(sorted(list(_FACTORIES) + list(_COMPOSITES)))


def _children(config, kind):
    children = config.pop("schedules", None)
    if not isinstance(children, (list, tuple)) or not children:
        raise CstorchValueError(
            f"{kind} config needs a non-empty list of child configs under "
            f"'schedules', got {children!r}"
        )
    return list(children)


def from_config(config: dict) -> Schedule:
    """Builds a schedule from ``{"kind": name, **arguments}`` (see the module docstring for
    the kinds and their arguments); composites nest child configs under ``"schedules"``."""
    config = dict(config)
    kind = config.pop("kind", None)
    if kind == "sequential":
        children = _children(config, kind)
        return sequential([from_config(c) for c in children], **config)
    if kind == "chained":
        children = _children(config, kind)
        initials = config.pop("initials", None)
        if initials is None:
            initials = []
            for c in children[1:]:
                if "initial" not in c:
                    raise CstorchValueError(f"a chained child needs an 'initial' value, got {c!r}")
                initials.append(c["initial"])
        if config:
            raise CstorchValueError(f"unexpected chained arguments {sorted(config)}")
        return chained([from_config(c) for c in children], initials)
    if kind == "scaled":
        children = _children(config, kind)
        if len(children) != 1:
            raise CstorchValueError(f"scaled wraps exactly one schedule, got {len(children)}")
        return scaled(from_config(children[0]), **config)
    try:
        factory = _FACTORIES[kind]
    except (KeyError, TypeError):
        raise CstorchValueError(f"unknown schedule kind {kind!r}; known: {list(KINDS)}") from None
    return factory(**config)
