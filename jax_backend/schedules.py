"""Schedules as pure functions of the step count, in the closed forms of cerebras-pytorch 2.10.

Each factory checks its arguments and returns ``count -> value`` (a float32 scalar), usable
directly as an optax schedule. ``from_config`` rebuilds a schedule from the JSON-able dict a
``cstorch`` scheduler describes itself with; that is how a traced step carries a schedule.

>>> f = linear(1.0, 0.0, total_iters=10)
>>> float(f(5)), float(f(12))
(0.5, 0.0)
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax.numpy as jnp

Schedule = Callable[[object], jnp.ndarray]
_F32 = jnp.float32


def _t(count):
    return jnp.asarray(count)


def _f(value):
    return jnp.asarray(value, _F32)


def constant(value: float) -> Schedule:
    def schedule(count):
        del count
        return _f(value)

    return schedule


def polynomial(initial: float, end: float, total_iters: int, power: float = 1.0,
               cycle: bool = False) -> Schedule:
    """``end`` once ``t >= total_iters``, else ``(initial-end)·(1-t/T)^power + end``.

    ``cycle`` is accepted for API compatibility; as in the reference, it cannot take effect
    because the clamp to ``end`` applies first (see cstorch's PolynomialLR docstring)."""
    if total_iters is None or total_iters <= 0:
        raise ValueError(f"polynomial schedule needs total_iters > 0, got {total_iters=}")
    diff = initial - end

    def schedule(count):
        t = _t(count)
        decayed = (1.0 - t.astype(_F32) / _f(total_iters)) ** _f(power) * _f(diff) + _f(end)
        return jnp.where(t >= total_iters, _f(end), decayed.astype(_F32))

    return schedule


def linear(initial: float, end: float, total_iters: int, cycle: bool = False) -> Schedule:
    return polynomial(initial, end, total_iters, 1.0, cycle)


def cosine_decay(initial: float, end: float, total_iters: int) -> Schedule:
    """``end + (initial-end)·½(1+cos(π·min(t,T)/T))``."""
    if total_iters is None or total_iters <= 0:
        raise ValueError(f"cosine_decay needs total_iters > 0, got {total_iters=}")
    diff = initial - end

    def schedule(count):
        step = jnp.minimum(_f(total_iters), _t(count).astype(_F32))
        progress = (jnp.cos(_f(math.pi) / _f(total_iters) * step) + 1.0) * 0.5
        return (progress * _f(diff) + _f(end)).astype(_F32)

    return schedule


def sequential(schedules: Sequence[Schedule], milestones: Sequence[int]) -> Schedule:
    """``schedules[k](t - milestones[k-1])`` for ``milestones[k-1] <= t < milestones[k]``."""
    if len(milestones) != len(schedules) - 1:
        raise ValueError(
            f"sequential needs one milestone fewer than schedules, got {len(schedules)} "
            f"schedules and {len(milestones)} milestones")

    def schedule(count):
        t = _t(count)
        value = schedules[0](t)
        for milestone, child in zip(milestones, schedules[1:]):
            value = jnp.where(t < milestone, value, child(jnp.maximum(t - milestone, 0)))
        return value

    return schedule


# ------------------------------------------------------------------------------ configs
_FACTORIES: dict[str, Callable[..., Schedule]] = {
    "constant": constant,
    "polynomial": polynomial,
    "linear": linear,
    "cosine_decay": cosine_decay,
}


def from_config(config: dict) -> Schedule:
    """Builds a schedule from ``{"kind": name, **arguments}``; composites nest configs."""
    config = dict(config)
    kind = config.pop("kind")
    if kind == "sequential":
        return sequential([from_config(c) for c in config["schedules"]], config["milestones"])
    try:
        factory = _FACTORIES[kind]
    except KeyError:
        raise ValueError(f"unknown schedule kind {kind!r}; known: "
                         f"{sorted(_FACTORIES) + ['sequential']}") from None
    return factory(**config)
