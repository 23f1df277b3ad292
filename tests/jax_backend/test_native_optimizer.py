"""The engine's fused CPU optimizer updates (``native_optimizer.py``,
``native/fused_optimizer.cc``): the Adam family's and SGD's update of a param group in one
native call.
Its numbers against numpy evaluating the rule in float32 one operation at a time (bit for bit)
and against the JAX rule XLA compiles (equal up to the roundings XLA's fused multiply-adds
change); where it is used: only in the engine's CPU program, for float32, with the library built
for the running jaxlib. (A traced cstorch step with it: tests/cstorch/optim/test_native_adam.py.)"""

from __future__ import annotations

import dataclasses
import os

import jax
import jaxlib
import numpy as np
import pytest

from jax_backend import native_optimizer, optimizers
from jax_backend.target import Target, lowering_for

NATIVE = Target("cpu", native_optimizer=True)
# A vector longer than the library's chunk (2**15 elements) and not a multiple of it, so the
# update is shared between threads; a matrix; odd small shapes; a scalar parameter.
SHAPES = [(3, 5), (70001,), (64, 96), (1,), ()]


def test_the_library_is_built_for_this_jaxlib():
    """`make native` builds it where the tests run (no skip: a broken build fails here)."""
    assert (
        os.path.basename(native_optimizer.LIBRARY.path())
        == f"_fused_optimizer-jaxlib{jaxlib.__version__}.so"
    )
    assert native_optimizer.LIBRARY.unavailable() is None


def _problem(seed, amsgrad=False, correct_bias=True, steps_done=3):
    rng = np.random.default_rng(seed)
    f32 = lambda s, scale=1.0: (rng.standard_normal(s) * scale).astype(np.float32)  # noqa: E731
    params = [f32(s) for s in SHAPES]
    grads = [f32(s, 0.1) for s in SHAPES]
    state = optimizers.AdamState(
        exp_avg=[f32(s, 0.01) for s in SHAPES],
        exp_avg_sq=[np.abs(f32(s, 1e-3)) for s in SHAPES],
        max_exp_avg_sq=[np.abs(f32(s, 1e-3)) for s in SHAPES] if amsgrad else None,
        beta1_power=[np.float32(0.9**steps_done)] * len(SHAPES) if correct_bias else None,
        beta2_power=[np.float32(0.999**steps_done)] * len(SHAPES) if correct_bias else None,
    )
    return params, grads, state


def _numpy_rule(p, g, s, i, lr, betas, eps, wd, l2, correct_bias):
    """adam_base's rule in float32, every operation rounded on its own (numpy never fuses)."""
    f = np.float32
    b1, b2 = betas
    if l2:
        g = g + p * f(l2)
    m = s.exp_avg[i] * f(b1) + g * f(1.0 - b1)
    v = s.exp_avg_sq[i] * f(b2) + (g * g) * f(1.0 - b2)
    vhat = v
    if s.max_exp_avg_sq is not None:
        vhat = np.maximum(s.max_exp_avg_sq[i], v)
    u = m / (np.sqrt(vhat) + f(eps))
    if correct_bias:
        u = u * (np.sqrt(f(1.0) - s.beta2_power[i]) / (f(1.0) - s.beta1_power[i]))
    u = u + p * f(wd)
    return p + -(u * f(lr)), m, v, vhat


def _magnitudes(p, g, s, i, lr, args):
    """The sums of the magnitudes of the terms behind the new value and moments (float64):
    rounding moves each by a few units of float32's roundoff of these, however much the
    terms cancel."""
    b1, b2 = args["betas"]
    p, g = np.abs(p.astype(np.float64)), np.abs(g.astype(np.float64))
    g = g + p * args["l2_regularization_rate"]
    m = np.abs(s.exp_avg[i]) * b1 + g * (1 - b1)
    v = np.abs(s.exp_avg_sq[i]) * b2 + g * g * (1 - b2)
    bias = 1.0
    if args["correct_bias"]:
        bias = np.sqrt(1.0 - s.beta2_power[i]) / (1.0 - s.beta1_power[i])
    u = m / (np.sqrt(v) + args["eps"]) * bias + p * args["weight_decay"]
    return p + float(lr) * u, m, v


CASES = {
    "adamw": ("adamw", dict(betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01), {}),
    "adam, coupled L2": ("adam", dict(betas=(0.8, 0.99), eps=1e-8, weight_decay=0.05), {}),
    "amsgrad": ("adamw", dict(eps=1e-6, weight_decay=0.0, amsgrad=True), dict(amsgrad=True)),
    "no bias correction": (
        "adamw",
        dict(eps=1e-6, weight_decay=0.1, correct_bias=False),
        dict(correct_bias=False),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_is_the_rule_one_rounding_per_operation(case):
    name, hyper, options = CASES[case]
    params, grads, state = _problem(1, **options)
    leaves, treedef = jax.tree.flatten(state)
    lr = np.float32(3e-3)  # traced, as a scheduled learning rate is

    def native(p, g, s, lr):
        with lowering_for(NATIVE):
            out = native_optimizer.update(name, {**hyper, "learning_rate": lr}, p, g, s, treedef)
        assert out is not None
        return out

    def xla(p, g, s, lr):
        return optimizers.apply(name, {**hyper, "learning_rate": lr}, p, g, s, treedef=treedef)

    new_params, new_leaves = jax.jit(native)(params, grads, leaves, lr)
    xla_params, xla_leaves = jax.jit(xla)(params, grads, leaves, lr)
    new_state = jax.tree.unflatten(treedef, new_leaves)
    xla_state = jax.tree.unflatten(treedef, xla_leaves)
    args = native_optimizer.adam_base_arguments(name, {**hyper, "learning_rate": lr})
    for i, p in enumerate(params):
        want_p, want_m, want_v, want_vhat = _numpy_rule(
            p,
            grads[i],
            state,
            i,
            lr,
            args["betas"],
            args["eps"],
            args["weight_decay"],
            args["l2_regularization_rate"],
            args["correct_bias"],
        )
        assert np.array_equal(np.asarray(new_params[i]), want_p), (case, SHAPES[i])
        assert np.array_equal(np.asarray(new_state.exp_avg[i]), want_m)
        assert np.array_equal(np.asarray(new_state.exp_avg_sq[i]), want_v)
        if state.max_exp_avg_sq is not None:
            assert np.array_equal(np.asarray(new_state.max_exp_avg_sq[i]), want_vhat)
        # XLA's program of the same rule: equal up to rounding (it fuses some multiply-adds),
        # bounded by the magnitudes of the terms each result sums (``_magnitudes``).
        bounds = _magnitudes(p, grads[i], state, i, lr, args)
        for got, want, magnitude in zip(
            (new_params[i], new_state.exp_avg[i], new_state.exp_avg_sq[i]),
            (xla_params[i], xla_state.exp_avg[i], xla_state.exp_avg_sq[i]),
            bounds,
        ):
            assert np.all(np.abs(np.asarray(got) - np.asarray(want)) <= 1e-6 * magnitude), case
    if args["correct_bias"]:
        for got, old, beta in (
            (new_state.beta1_power, state.beta1_power, args["betas"][0]),
            (new_state.beta2_power, state.beta2_power, args["betas"][1]),
        ):
            for g, o in zip(got, old):
                assert np.asarray(g) == o * np.float32(beta)


def test_operands_not_donated_keep_their_values():
    """The call writes its results in place of its operands; where the caller did not donate
    them (a state array someone still holds), XLA must copy first: the inputs keep their
    values, and the same call on them gives the same result twice."""
    params, grads, state = _problem(5)
    params, grads = jax.device_put(params), jax.device_put(grads)
    leaves, treedef = jax.tree.flatten(jax.device_put(state))
    before = [np.asarray(a).copy() for a in params + leaves]

    @jax.jit
    def native(p, g, s):
        with lowering_for(NATIVE):
            return native_optimizer.update("adamw", {"learning_rate": 0.1}, p, g, s, treedef)

    first = native(params, grads, leaves)
    second = native(params, grads, leaves)
    for held, value in zip(params + leaves, before):
        assert np.array_equal(np.asarray(held), value)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(first[0][1]), before[1])  # it did update


def test_other_rules_and_dtypes_are_left_to_xla():
    params, grads, state = _problem(2)
    leaves, treedef = jax.tree.flatten(state)
    hyper = {"learning_rate": 1e-3}
    with lowering_for(NATIVE):
        # a float64 learning rate: the JAX rule computes its update in float64
        wide = {"learning_rate": np.float64(1e-3)}
        assert native_optimizer.update("adamw", wide, params, grads, leaves, treedef) is None
        # another rule (its state is not Adam's), or Adam's state under another rule's name
        assert native_optimizer.update("lion", hyper, params, grads, leaves, treedef) is None
        assert native_optimizer.update("sgd", hyper, params, grads, leaves, treedef) is None
        halves = [p.astype(jax.numpy.bfloat16) for p in params]
        assert native_optimizer.update("adamw", hyper, halves, grads, leaves, treedef) is None
        assert (
            native_optimizer.update("adamw", {"nonsense": 1}, params, grads, leaves, treedef)
            is None
        )


# ------------------------------------------------------------------ SGD
def _numpy_sgd(p, g, buf, lr, momentum, dampening, wd, nesterov, maximize):
    """optimizers.sgd's rule in float32, every operation rounded on its own."""
    f = np.float32
    g = (-g if maximize else g) + p * f(wd)
    if buf is not None:
        buf = buf * f(momentum) + g * f(1.0 - dampening)
        g = g + buf * f(momentum) if nesterov else buf
    return p + (-lr) * g, buf


SGD_CASES = {
    "plain": dict(momentum=0.0),
    "momentum, weight decay": dict(momentum=0.9, weight_decay=1e-2),
    "nesterov, maximize": dict(momentum=0.8, nesterov=True, maximize=True, weight_decay=1e-3),
    "dampening": dict(momentum=0.9, dampening=0.3),
}


@pytest.mark.parametrize("case", sorted(SGD_CASES))
def test_sgd_is_the_rule_one_rounding_per_operation(case):
    hyper = SGD_CASES[case]
    rng = np.random.default_rng(4)
    params = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in SHAPES]
    state = optimizers.sgd(1.0, **hyper).init(params)
    if state.momentum_buffer is not None:
        state = state._replace(
            momentum_buffer=[(rng.standard_normal(s) * 0.1).astype(np.float32) for s in SHAPES]
        )
    leaves, treedef = jax.tree.flatten(state)
    lr = np.float32(0.05)

    def native(p, g, s, lr):
        with lowering_for(NATIVE):
            out = native_optimizer.update("sgd", {**hyper, "learning_rate": lr}, p, g, s, treedef)
        assert out is not None
        return out

    def xla(p, g, s, lr):
        return optimizers.apply("sgd", {**hyper, "learning_rate": lr}, p, g, s, treedef=treedef)

    new_params, new_leaves = jax.jit(native)(params, grads, leaves, lr)
    xla_params, xla_leaves = jax.jit(xla)(params, grads, leaves, lr)
    new_state = jax.tree.unflatten(treedef, new_leaves)
    for i, p in enumerate(params):
        buf = None if state.momentum_buffer is None else state.momentum_buffer[i]
        want_p, want_buf = _numpy_sgd(
            p,
            grads[i],
            buf,
            lr,
            hyper.get("momentum", 0.0),
            hyper.get("dampening", 0.0),
            hyper.get("weight_decay", 0.0),
            hyper.get("nesterov", False),
            hyper.get("maximize", False),
        )
        assert np.array_equal(np.asarray(new_params[i]), want_p), (case, SHAPES[i])
        if buf is not None:
            assert np.array_equal(np.asarray(new_state.momentum_buffer[i]), want_buf)
        # XLA's program: equal up to its fused multiply-adds, bounded by the terms' sizes.
        g = np.abs(grads[i]) + np.abs(p) * hyper.get("weight_decay", 0.0)
        if buf is not None:
            g = g + np.abs(buf) * hyper.get("momentum", 0.0) * 2
        magnitude = np.abs(p) + float(lr) * g
        assert np.all(
            np.abs(np.asarray(new_params[i]) - np.asarray(xla_params[i])) <= 1e-6 * magnitude
        )
    assert len(new_leaves) == len(xla_leaves)


# ------------------------------------------------------------------ where it is used
def test_wanted_only_for_the_engines_cpu_program(monkeypatch):
    from jax_backend import config

    assert config.cpu_optimizer.default == "native"
    monkeypatch.delenv("CSTORCH_CPU_OPTIMIZER", raising=False)
    assert native_optimizer.wanted("cpu", None)
    assert not native_optimizer.wanted("cuda", None)
    assert not native_optimizer.wanted("cpu", object())  # a mesh of devices
    monkeypatch.setenv("CSTORCH_CPU_OPTIMIZER", "xla")
    assert not native_optimizer.wanted("cpu", None)
    monkeypatch.setenv("CSTORCH_CPU_OPTIMIZER", "fused")  # only its two words
    with pytest.raises(config.SettingError, match="must be one of native, xla"):
        native_optimizer.wanted("cpu", None)
    monkeypatch.setenv("CSTORCH_CPU_OPTIMIZER", "xla")
    assert not Target().native_optimizer  # exports, pure_function, direct lowerings
    with lowering_for(Target("cpu")):
        assert not native_optimizer.applies()


def test_without_the_library_xlas_kernels_run(monkeypatch):
    monkeypatch.delenv("CSTORCH_CPU_OPTIMIZER", raising=False)
    missing = dataclasses.replace(native_optimizer.LIBRARY, name="not_built")
    monkeypatch.setattr(native_optimizer, "LIBRARY", missing)
    assert not native_optimizer.wanted("cpu", None)
    params, grads, state = _problem(3)
    leaves, treedef = jax.tree.flatten(state)
    with lowering_for(NATIVE):
        assert native_optimizer.update("adamw", {}, params, grads, leaves, treedef) is None
