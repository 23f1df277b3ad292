"""The closed-form schedules against cerebras-pytorch 2.10.

Values come from ``tests/data/reference-2.10/scheduler_values.json``: for each
scheduler, ``lr`` of param group 0 right after construction (count 0) and after each of 40
``scheduler.step()`` calls (count k). The fixture does not record the constructor arguments, so
the table below gives the ones inferred from the values. Schedules without a fixture series,
and the ones whose reference behaviour is a bug fixed here, are checked against hand-written
numpy references and, where torch's scheduler has the same maths, ``torch.optim.lr_scheduler``.
"""

from __future__ import annotations

import doctest
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from jax_backend import schedules
from tests.lanes import marked_cases
from tests.reference_data import REFERENCE

FIXTURES = REFERENCE
VALUES = json.loads((FIXTURES / "scheduler_values.json").read_text())["values"]

# fixture name -> config with the inferred constructor arguments
FIXTURE_CONFIGS = {
    # 0.1 throughout
    "ConstantLR": {"kind": "constant", "value": 0.1},
    # 0.1, then -0.0045 per step until 0.01 at t=20
    "LinearLR": {"kind": "linear", "initial": 0.1, "end": 0.01, "total_iters": 20},
    # 0.1·(1 - t/20)^2: 0.09025 at t=1, 0 from t=20
    "PolynomialLR_p2": {
        "kind": "polynomial",
        "initial": 0.1,
        "end": 0.0,
        "total_iters": 20,
        "power": 2.0,
    },
    # halves every 10 steps, smoothly
    "ExponentialLR": {"kind": "exponential", "initial": 0.1, "total_iters": 10, "decay_rate": 0.5},
    # halves every 10 steps, in stairs
    "ExponentialLR_staircase": {
        "kind": "exponential",
        "initial": 0.1,
        "total_iters": 10,
        "decay_rate": 0.5,
        "staircase": True,
    },
    # 0.1/(1 + t/10): 0.0909 at t=1, 0.05 at t=10, 0.02 at t=40
    "InverseExponentialTimeDecayLR": {
        "kind": "inverse_exponential_time_decay",
        "initial": 0.1,
        "step_exponent": 1.0,
        "total_iters": 10,
        "decay_rate": 1.0,
    },
    # 0.5 = 1/√4 up to t=4, then 1/√t
    "InverseSquareRootDecayLR": {
        "kind": "inverse_square_root_decay",
        "initial": 1.0,
        "scale": 1.0,
        "warmup_steps": 4.0,
    },
    # cosine from 0.1 to 0.01 over 30 steps, then flat
    "CosineDecayLR": {"kind": "cosine_decay", "initial": 0.1, "end": 0.01, "total_iters": 30},
    # cosine between 0.1 and 0.001 with period 20 (half period 10), unclamped
    "CosineAnnealingLR": {
        "kind": "cosine_annealing",
        "initial": 0.1,
        "T_max": 10,
        "eta_min": 0.001,
    },
    # halves every 7 steps
    "StepLR": {"kind": "step", "initial": 0.1, "step_size": 7, "gamma": 0.5},
    # ×0.3 at t=5, 12 and 30
    "MultiStepLR": {"kind": "multi_step", "initial": 0.1, "gamma": 0.3, "milestones": [5, 12, 30]},
    # 0.1 until 10, 0.05 until 25, then 0.01
    "PiecewiseConstantLR": {
        "kind": "piecewise_constant",
        "values": [0.1, 0.05, 0.01],
        "milestones": [10, 25],
    },
    # ×0.9 per step
    "MultiplicativeLR": {"kind": "multiplicative", "initial": 0.1, "coefficient": 0.9},
    # 0.01 -> 0.1 in 5 steps and back in 5
    "CyclicLR": {"kind": "cyclic", "base": 0.01, "max_value": 0.1, "step_size_up": 5},
    # 0.01 -> 0.1 in 4 steps, back in 6, amplitude halved each cycle
    "CyclicLR_triangular2": {
        "kind": "cyclic",
        "base": 0.01,
        "max_value": 0.1,
        "step_size_up": 4,
        "step_size_down": 6,
        "mode": "triangular2",
    },
    # 0.01 -> peak 0.1 at t=11 (= 0.3·40 - 1) -> 1e-6 (= 0.01/1e4) at t=39, cosine phases
    "OneCycleLR": {
        "kind": "one_cycle",
        "initial": 0.01,
        "max_value": 0.1,
        "total_steps": 40,
        "pct_start": 0.3,
        "final_div_factor": 1e4,
    },
    # linear warm-up 0 -> 0.1 over 8 steps, then cosine 0.1 -> 0 over 32 steps
    "SequentialLR": {
        "kind": "sequential",
        "milestones": [8],
        "schedules": [
            {"kind": "linear", "initial": 0.0, "end": 0.1, "total_iters": 8},
            {"kind": "cosine_decay", "initial": 0.1, "end": 0.0, "total_iters": 32},
        ],
    },
    # the values equal ExponentialLR's (0.1·0.5^(t/10)); how the chain splits them is not
    # identifiable, so this uses two children that each halve every 20 steps
    "ChainedScheduler": {
        "kind": "chained",
        "schedules": [
            {"kind": "exponential", "initial": 0.1, "total_iters": 20, "decay_rate": 0.5},
            {"kind": "exponential", "initial": 2.0, "total_iters": 20, "decay_rate": 0.5},
        ],
    },
}


def test_every_fixture_series_has_a_config():
    assert set(FIXTURE_CONFIGS) == set(VALUES)


@pytest.mark.parametrize(
    "name", marked_cases(sorted(VALUES), ids=sorted(VALUES), slow={"ChainedScheduler"})
)
def test_fixture_values(name):
    want = np.asarray(VALUES[name], np.float64)
    schedule = schedules.from_config(FIXTURE_CONFIGS[name])
    counts = jnp.arange(len(want), dtype=jnp.int64)
    eager = np.asarray([float(schedule(c)) for c in counts])
    jitted = np.asarray(jax.vmap(jax.jit(schedule))(counts))
    np.testing.assert_allclose(eager, want, rtol=0, atol=1e-7)
    np.testing.assert_allclose(jitted, want, rtol=0, atol=1e-7)
    assert jitted.dtype == np.float32
    assert float(schedule(3)) == float(schedule(jnp.asarray(3, jnp.int32)))


def test_chained_trivial_split_matches_too():
    chain = schedules.chained(
        [schedules.exponential(0.1, 10, 0.5), schedules.multiplicative(1.0, 1.0)], initials=[1.0]
    )
    want = np.asarray(VALUES["ChainedScheduler"])
    got = np.asarray([float(chain(t)) for t in range(len(want))])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)


# ------------------------------------------------------------------ every kind, jitted
KIND_EXAMPLES = {
    "constant": {"value": 0.3},
    "polynomial": {"initial": 1.0, "end": 0.1, "total_iters": 7, "power": 0.5, "cycle": True},
    "linear": {"initial": 1.0, "end": 0.0, "total_iters": 10},
    "exponential": {"initial": 1.0, "total_iters": 7, "decay_rate": 0.7, "staircase": True},
    "inverse_exponential_time_decay": {
        "initial": 1.0,
        "step_exponent": 2,
        "total_iters": 5,
        "decay_rate": 0.5,
        "staircase": True,
    },
    "inverse_square_root_decay": {"initial": 2.0, "scale": 0.5, "warmup_steps": 3},
    "cosine_decay": {"initial": 1.0, "end": 0.0, "total_iters": 10},
    "piecewise_constant": {"values": [1.0, 0.5], "milestones": [3]},
    "multi_step": {"initial": 1.0, "gamma": 0.1, "milestones": [2, 4]},
    "step": {"initial": 1.0, "step_size": 3, "gamma": 0.1},
    "cosine_annealing": {"initial": 1.0, "T_max": 4},
    "lambda": {"initial": 0.5, "fn": "default"},
    "cosine_annealing_warm_restarts": {"initial": 1.0, "T_0": 4, "eta_min": 0.1},
    "multiplicative": {"initial": 1.0, "coefficient": 0.9},
    "cyclic": {"base": 0.1, "max_value": 1.0, "step_size_up": 3, "mode": "exp_range", "gamma": 0.9},
    "one_cycle": {
        "initial": 0.1,
        "max_value": 1.0,
        "total_steps": 20,
        "three_phase": True,
        "anneal_strategy": "linear",
    },
    "sequential": {
        "milestones": [3],
        "schedules": [
            {"kind": "constant", "value": 0.1},
            {"kind": "linear", "initial": 1.0, "end": 0.0, "total_iters": 5},
        ],
    },
    "chained": {
        "schedules": [
            {"kind": "step", "initial": 1.0, "step_size": 2, "gamma": 0.5},
            {"kind": "cosine_annealing", "initial": 2.0, "T_max": 5},
        ]
    },
    "scaled": {
        "factor": 0.5,
        "schedules": [{"kind": "linear", "initial": 1.0, "end": 0.0, "total_iters": 10}],
    },
}


def test_kind_examples_cover_every_kind():
    assert set(KIND_EXAMPLES) == set(schedules.KINDS)


@pytest.mark.parametrize(
    "kind", marked_cases(sorted(KIND_EXAMPLES), ids=sorted(KIND_EXAMPLES), slow={"chained"})
)
def test_every_kind_in_jit_with_traced_int64_count(kind):
    schedule = schedules.from_config({"kind": kind, **KIND_EXAMPLES[kind]})
    counts = jnp.arange(25, dtype=jnp.int64)
    traced = jax.jit(lambda c: jax.lax.map(schedule, c))(counts)
    eager = np.asarray([float(schedule(int(c))) for c in counts])
    assert traced.dtype == jnp.float32 and traced.shape == (25,)
    np.testing.assert_allclose(np.asarray(traced), eager, rtol=1e-6, atol=1e-7)
    assert np.all(np.isfinite(eager))


def test_usable_as_optax_schedule():
    tx = optax.sgd(learning_rate=schedules.linear(1.0, 0.0, total_iters=4))
    params = jnp.zeros(2, jnp.float32)
    state = tx.init(params)
    step = jax.jit(lambda p, s: tx.update(jnp.ones(2, jnp.float32), s, p))
    moved = []
    for _ in range(6):
        updates, state = step(params, state)
        moved.append(float(updates[0]))
    np.testing.assert_allclose(moved, [-1.0, -0.75, -0.5, -0.25, 0.0, 0.0], atol=1e-7)


# ------------------------------------------------------------------ corrected bugs
def _np_cosine(initial, eta_min, t_cur, period):
    return eta_min + (initial - eta_min) * (1 + np.cos(np.pi * t_cur / period)) / 2


def test_cosine_annealing_warm_restarts_restarts_every_period():
    schedule = schedules.cosine_annealing_warm_restarts(1.0, T_0=4, eta_min=0.0)
    t = np.arange(14)
    got = np.asarray([float(schedule(int(k))) for k in t])
    np.testing.assert_allclose(got, _np_cosine(1.0, 0.0, t % 4, 4), atol=1e-7)
    # the reference's sequence (piecewise constant after the first period) is not reproduced
    buggy = [1, 0.854, 0.5, 0.146, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1]
    assert not np.allclose(got, buggy, atol=1e-3)
    np.testing.assert_allclose(got[:4], buggy[:4], atol=1e-3)  # same first period


def test_cosine_annealing_warm_restarts_matches_torch():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    ref = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=5, eta_min=0.05)
    schedule = schedules.cosine_annealing_warm_restarts(0.5, T_0=5, eta_min=0.05)
    for t in range(23):
        assert abs(float(schedule(t)) - ref.get_last_lr()[0]) < 1e-7
        opt.step()
        ref.step()


def _np_polynomial_cycle(initial, end, total, power, t):
    """TF/Keras PolynomialDecay(cycle=True)."""
    multiplier = np.where(t == 0, 1.0, np.ceil(t / total))
    decay_steps = total * multiplier
    return (initial - end) * (1 - t / decay_steps) ** power + end


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
def test_polynomial_cycle_follows_keras(power):
    t = np.arange(40)
    schedule = schedules.polynomial(0.1, 0.01, total_iters=8, power=power, cycle=True)
    got = np.asarray([float(schedule(int(k))) for k in t])
    np.testing.assert_allclose(got, _np_polynomial_cycle(0.1, 0.01, 8, power, t), atol=1e-7)
    plain = schedules.polynomial(0.1, 0.01, total_iters=8, power=power)
    assert float(schedule(9)) > 0.01 and float(plain(9)) == pytest.approx(0.01)
    linear = schedules.linear(0.1, 0.01, total_iters=8, cycle=True)
    if power == 1.0:
        np.testing.assert_allclose([float(linear(int(k))) for k in t], got, atol=1e-7)


@pytest.mark.slow
def test_lambda_applies_initial_once():
    t = np.arange(20)
    default = schedules.lambda_schedule(0.5, "default")
    want = 0.5 * (t / 30) * 0.95**t  # the reference gives 0.5**2·(t/30)·0.95**t
    np.testing.assert_allclose([float(default(int(k))) for k in t], want, atol=1e-7)
    custom = schedules.lambda_schedule(2.0, lambda c: 1.0 / (1.0 + c))
    np.testing.assert_allclose([float(custom(int(k))) for k in t], 2.0 / (1 + t), atol=1e-7)
    several = schedules.lambda_schedule(2.0, [lambda c: 0.5, lambda c: 0.9**c])
    np.testing.assert_allclose([float(several(int(k))) for k in t], 2.0 * 0.5 * 0.9**t, rtol=1e-6)


def test_lambda_from_config_with_registered_function():
    schedules.register_lambda("test_halving", lambda c: 0.5 ** jnp.asarray(c, jnp.float32))
    schedule = schedules.from_config({"kind": "lambda", "initial": 3.0, "fn": ["test_halving"]})
    assert float(schedule(2)) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="unknown lambda"):
        schedules.from_config({"kind": "lambda", "initial": 3.0, "fn": "nope"})


# ------------------------------------------------------------------ torch cross-checks
def _torch_series(make, steps):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0, momentum=0.9)
    sched = make(opt)
    values = []
    for _ in range(steps):
        values.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return np.asarray(values)


TORCH_CROSS = [
    (
        "one_cycle cos 3-phase",
        schedules.one_cycle(0.004, 0.1, total_steps=30, pct_start=0.25, three_phase=True),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(
            o,
            max_lr=0.1,
            total_steps=30,
            pct_start=0.25,
            div_factor=25.0,
            three_phase=True,
            cycle_momentum=False,
        ),
        30,
    ),
    (
        "one_cycle linear",
        schedules.one_cycle(0.004, 0.1, total_steps=30, anneal_strategy="linear"),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(
            o,
            max_lr=0.1,
            total_steps=30,
            div_factor=25.0,
            anneal_strategy="linear",
            cycle_momentum=False,
        ),
        30,
    ),
    (
        "cyclic exp_range",
        schedules.cyclic(0.01, 0.1, step_size_up=3, step_size_down=5, mode="exp_range", gamma=0.97),
        lambda o: torch.optim.lr_scheduler.CyclicLR(
            o,
            base_lr=0.01,
            max_lr=0.1,
            step_size_up=3,
            step_size_down=5,
            mode="exp_range",
            gamma=0.97,
            cycle_momentum=False,
        ),
        40,
    ),
    (
        "multi_step",
        schedules.multi_step(1.0, 0.5, [3, 7]),
        lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [3, 7], gamma=0.5),
        12,
    ),
    (
        "step",
        schedules.step(1.0, 4, 0.3),
        lambda o: torch.optim.lr_scheduler.StepLR(o, 4, gamma=0.3),
        12,
    ),
]


@pytest.mark.parametrize("label,schedule,make,steps", TORCH_CROSS, ids=[c[0] for c in TORCH_CROSS])
def test_matches_torch_scheduler(label, schedule, make, steps):
    want = _torch_series(make, steps)
    got = np.asarray([float(schedule(t)) for t in range(steps)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_scaled():
    base = schedules.linear(1.0, 0.0, total_iters=10)
    half = schedules.scaled(base, 0.5)
    assert float(half(4)) == pytest.approx(0.3)
    assert half(4).dtype == jnp.float32


def test_chained_initials_from_config():
    config = KIND_EXAMPLES["chained"]
    schedule = schedules.from_config({"kind": "chained", **config})
    for t in range(12):
        want = 0.5 ** (t // 2) * (1 + math.cos(math.pi * t / 5)) / 2
        assert float(schedule(t)) == pytest.approx(want, abs=1e-7)


# ------------------------------------------------------------------ argument checks
BAD_ARGUMENTS = [
    (schedules.polynomial, dict(initial=1.0, end=0.0, total_iters=0), ValueError, "total_iters=0"),
    (schedules.linear, dict(initial=1.0, end=0.0, total_iters=-3), ValueError, "-3"),
    (
        schedules.exponential,
        dict(initial=1.0, total_iters=0, decay_rate=0.5),
        ValueError,
        "total_iters=0",
    ),
    (
        schedules.inverse_exponential_time_decay,
        dict(initial=1.0, step_exponent=1, total_iters=0, decay_rate=0.5),
        ValueError,
        "total_iters",
    ),
    (schedules.inverse_square_root_decay, dict(warmup_steps=0), ValueError, "warmup_steps=0"),
    (schedules.cosine_decay, dict(initial=1.0, end=0.0, total_iters=None), ValueError, "None"),
    (schedules.step, dict(initial=1.0, step_size=0, gamma=0.5), ValueError, "step_size=0"),
    (schedules.cosine_annealing, dict(initial=1.0, T_max=0), ValueError, "T_max=0"),
    (
        schedules.cosine_annealing_warm_restarts,
        dict(initial=1.0, T_0=4, T_mult=2),
        ValueError,
        "T_mult=2",
    ),
    (schedules.cosine_annealing_warm_restarts, dict(initial=1.0, T_0=0), ValueError, "T_0=0"),
    (schedules.multi_step, dict(initial=1.0, gamma=0.5, milestones=[2.5]), TypeError, "2.5"),
    (
        schedules.piecewise_constant,
        dict(values=[1.0], milestones=[2, 4]),
        ValueError,
        "milestones=[2, 4]",
    ),
    (schedules.cyclic, dict(base=0.1, max_value=1.0, step_size_up=0), ValueError, "step_size_up=0"),
    (
        schedules.cyclic,
        dict(base=0.1, max_value=1.0, step_size_down=-1),
        ValueError,
        "step_size_down=-1",
    ),
    (
        schedules.one_cycle,
        dict(initial=0.1, max_value=1.0, total_steps=10, pct_start=0.05),
        ValueError,
        "pct_start=0.05",
    ),
    (
        schedules.one_cycle,
        dict(initial=0.1, max_value=1.0, total_steps=0),
        ValueError,
        "total_steps=0",
    ),
    (schedules.lambda_schedule, dict(initial=1.0, fn=3), ValueError, "3"),
    (
        schedules.chained,
        dict(schedules=[schedules.constant(1.0)] * 2, initials=[]),
        ValueError,
        "initials=[]",
    ),
    (
        schedules.chained,
        dict(schedules=[schedules.constant(1.0)] * 2, initials=[0.0]),
        ValueError,
        "initials=[0.0]",
    ),
    (
        schedules.sequential,
        dict(schedules=[schedules.constant(1.0)] * 2, milestones=[5, 6]),
        ValueError,
        "2 schedules and 2 milestones",
    ),
    (
        schedules.sequential,
        dict(schedules=[schedules.constant(1.0)] * 2, milestones=[5.0]),
        TypeError,
        "5.0",
    ),
]


@pytest.mark.parametrize(
    "factory,kwargs,error,text",
    BAD_ARGUMENTS,
    ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(BAD_ARGUMENTS)],
)
def test_argument_checks(factory, kwargs, error, text):
    with pytest.raises(error) as info:
        factory(**kwargs)
    assert text in str(info.value)


@pytest.mark.parametrize(
    "config,text",
    [
        ({"kind": "nope"}, "unknown schedule kind 'nope'"),
        ({"value": 1.0}, "unknown schedule kind None"),
        ({"kind": "sequential", "milestones": []}, "'schedules'"),
        (
            {
                "kind": "chained",
                "schedules": [
                    {"kind": "constant", "value": 1.0},
                    {"kind": "constant", "value": 1.0},
                ],
            },
            "'initial'",
        ),
        ({"kind": "scaled", "factor": 2.0, "schedules": []}, "'schedules'"),
    ],
)
def test_bad_configs(config, text):
    with pytest.raises(ValueError) as info:
        schedules.from_config(config)
    assert text in str(info.value)


def test_module_doctests():
    result = doctest.testmod(schedules, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
