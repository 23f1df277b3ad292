"""The pure optimizer transformations against cerebras-pytorch 2.10.

Trajectories come from ``tests/data/reference-2.10/optimizer_trajectories.json``
(recorded with the real cstorch optimizers); options the fixture does not exercise are checked
against ``torch.optim`` where cstorch's maths is torch's, and against small hand-written
references otherwise (Muon, AMSGrad).
"""

from __future__ import annotations

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from jax_backend import optimizers, schedules
from tests.lanes import marked_cases
from tests.reference_data import (
    OPTIMIZER_TRAJECTORIES as TRAJECTORIES,
    optimizer_problem as _problem,
)

_W, _B, _X, _T = _problem()
_XJ, _TJ = jnp.asarray(_X.numpy()), jnp.asarray(_T.numpy())


def _loss(params):
    w, b = params
    return jnp.mean((_XJ @ w + b - _TJ) ** 2)


_grad = jax.jit(jax.grad(_loss))


def _params():
    return [jnp.asarray(_W.numpy()), jnp.asarray(_B.numpy())]


def _factory_kwargs(torch_kwargs: dict) -> dict:
    """torch constructor kwargs -> factory kwargs (only ``lr`` is renamed)."""
    return {("learning_rate" if k == "lr" else k): v for k, v in torch_kwargs.items()}


def _rel_err(got, want):
    """Largest |got - want| over the largest |want| (per tensor)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


# ------------------------------------------------------------------ fixture trajectories
@pytest.mark.parametrize(
    "case", marked_cases(sorted(TRAJECTORIES), ids=sorted(TRAJECTORIES), slow={"ASGD", "Adafactor"})
)
def test_fixture_trajectory(case):
    entry = TRAJECTORIES[case]
    tx = optimizers.OPTIMIZERS[entry["class"].lower()](**_factory_kwargs(entry["kwargs"]))
    params = _params()
    state = tx.init(params)
    for step, want in enumerate(entry["params_after_each_step"]):
        updates, state = tx.update(_grad(params), state, params)
        params = optax.apply_updates(params, updates)
        for p, w in zip(params, want):
            w = np.asarray(w, np.float32).reshape(p.shape)
            assert _rel_err(p, w) < 1e-5, (case, step)
            np.testing.assert_allclose(
                np.asarray(p), w, rtol=1e-5, atol=1e-7, err_msg=f"{case} step {step}"
            )


@pytest.mark.parametrize("case", sorted(TRAJECTORIES))
def test_fixture_state_keys(case):
    # The fixture records sorted(optimizer.state[w].keys()) for the first parameter, w.
    entry = TRAJECTORIES[case]
    name, kwargs = entry["class"].lower(), _factory_kwargs(entry["kwargs"])
    state = optimizers.init_state(name, kwargs, _params())
    assert sorted(optimizers.param_state_keys(state, 0)) == entry["state_keys"]
    if name == "adafactor":  # w (2-d) is factored, b (1-d) is not
        assert sorted(optimizers.state_keys(state)) == sorted(entry["state_keys"] + ["exp_avg_sq"])
        assert optimizers.param_state_keys(state, 1) == ("exp_avg_sq", "step")
    else:
        assert sorted(optimizers.state_keys(state)) == entry["state_keys"]


# ------------------------------------------------------------------ state layout
# Field order = the order cstorch inserts the keys (preinitialize, then `step`).
FIELD_ORDER = [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9}, ["momentum_buffer"]),
    ("sgd", {"learning_rate": 0.1}, []),
    (
        "adam",
        {"amsgrad": True},
        ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "beta1_power", "beta2_power"],
    ),
    ("adamw", {"correct_bias": False}, ["exp_avg", "exp_avg_sq"]),
    ("adadelta", {}, ["square_avg", "acc_delta"]),
    (
        "adafactor",
        {"learning_rate": 0.01},
        ["exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq", "step"],
    ),
    ("adagrad", {}, ["sum", "step"]),
    ("adamax", {}, ["exp_avg", "exp_inf", "beta1_power"]),
    ("asgd", {}, ["eta", "mu", "ax", "step"]),
    ("lamb", {}, ["exp_avg", "exp_avg_sq"]),
    ("lion", {}, ["exp_avg"]),
    ("muon", {}, ["momentum_buffer"]),
    ("muon", {"momentum": 0.0}, []),
    ("nadam", {}, ["mu_product", "exp_avg", "exp_avg_sq", "step"]),
    ("radam", {}, ["exp_avg", "exp_avg_sq", "step"]),
    ("rmsprop", {"momentum": 0.5, "centered": True}, ["square_avg", "momentum_buffer", "grad_avg"]),
    ("rmsprop", {}, ["square_avg"]),
    ("rprop", {}, ["prev", "step_size"]),
]
SCALAR_KEYS = {"step", "beta1_power", "beta2_power", "eta", "mu", "mu_product"}


@pytest.mark.parametrize("name,kwargs,fields", FIELD_ORDER)
def test_state_fields_and_layout(name, kwargs, fields):
    params = _params()
    state = optimizers.build(name, kwargs).init(params)
    assert list(optimizers.state_keys(state)) == fields
    for key in fields:
        value = getattr(state, key)
        assert isinstance(value, list) and len(value) == len(params), key
        for _p, v in zip(params, value):
            if v is None:  # only Adafactor mixes keys across parameters
                assert name == "adafactor"
            elif key in SCALAR_KEYS:
                assert v.shape == () and v.dtype == jnp.float32, key
    assert list(optimizers.init_state(name, kwargs, params)) == fields


def test_registry_names():
    assert set(optimizers.OPTIMIZERS) >= {
        "sgd",
        "adam",
        "adamw",
        "adadelta",
        "adafactor",
        "adagrad",
        "adamax",
        "asgd",
        "lamb",
        "lion",
        "muon",
        "nadam",
        "radam",
        "rmsprop",
        "rprop",
    }
    with pytest.raises(ValueError, match="unknown optimizer"):
        optimizers.build("adamz", {})


# ------------------------------------------------------------------ generic behaviour
# Every optimizer with its optional state switched on; Muon gets >= 2-d parameters only.
ALL_OPTIONS = [
    (
        "sgd",
        {
            "learning_rate": 0.1,
            "momentum": 0.9,
            "dampening": 0.1,
            "weight_decay": 0.01,
            "maximize": True,
        },
    ),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
    ("adam", {"learning_rate": 0.01, "weight_decay": 0.1, "amsgrad": True}),
    ("adamw", {"learning_rate": 0.01, "weight_decay": 0.1}),
    ("adamw", {"learning_rate": 0.01, "correct_bias": False}),
    ("adadelta", {"learning_rate": 1.0, "weight_decay": 0.1, "maximize": True}),
    ("adafactor", {"learning_rate": 0.01, "weight_decay": 0.1}),
    ("adafactor", {"learning_rate": 0.01, "beta1": 0.9, "scale_parameter": False}),
    ("adagrad", {"learning_rate": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1}),
    ("adamax", {"learning_rate": 0.01, "weight_decay": 0.1}),
    ("asgd", {"learning_rate": 0.01, "t0": 2.0, "weight_decay": 0.1}),
    ("lamb", {"learning_rate": 0.01, "weight_decay": 0.1}),
    ("lamb", {"learning_rate": 0.01, "adam": True}),
    ("lion", {"learning_rate": 0.001, "weight_decay": 0.1}),
    ("muon", {"learning_rate": 0.02}),
    ("nadam", {"learning_rate": 0.01, "weight_decay": 0.1}),
    ("radam", {"learning_rate": 0.01, "weight_decay": 0.1}),
    ("rmsprop", {"learning_rate": 0.01, "momentum": 0.5, "centered": True}),
    ("rprop", {"learning_rate": 0.01}),
]


def _generic_params(name):
    rs = np.random.RandomState(1)
    shapes = [(4, 3), (2, 3, 2, 2)] if name == "muon" else [(4, 3), (3,), ()]
    return [jnp.asarray(np.asarray(rs.randn(*s), np.float32)) for s in shapes]


def _generic_grads(params, seed):
    rs = np.random.RandomState(seed)
    return [jnp.asarray(np.asarray(rs.randn(*p.shape), np.float32)) for p in params]


def _case_id(case):
    return case[0] + "-" + "-".join(f"{k}" for k in case[1] if k != "learning_rate")


@pytest.mark.parametrize(
    "name,kwargs",
    marked_cases(
        ALL_OPTIONS,
        ids=map(_case_id, ALL_OPTIONS),
        slow={
            "adadelta-weight_decay-maximize",
            "adafactor-beta1-scale_parameter",
            "adafactor-weight_decay",
            "adam-weight_decay-amsgrad",
            "adamw-weight_decay",
            "lamb-weight_decay",
            "muon-",
            "nadam-weight_decay",
            "radam-weight_decay",
            "sgd-momentum-dampening-weight_decay-maximize",
        },
    ),
)
def test_jitted_update_does_not_recompile(name, kwargs):
    tx = optimizers.build(name, kwargs)
    traces = []

    def step(params, state, grads):
        traces.append(1)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(step)
    params = _generic_params(name)
    state = tx.init(params)
    for seed in range(3):
        params, state = step(params, state, _generic_grads(params, seed))
    assert len(traces) == 1
    assert all(bool(jnp.all(jnp.isfinite(p))) for p in params)


ONE_PER_OPTIMIZER = list({name: (name, kwargs) for name, kwargs in reversed(ALL_OPTIONS)}.values())[
    ::-1
]


@pytest.mark.parametrize("name,kwargs", ONE_PER_OPTIMIZER, ids=map(_case_id, ONE_PER_OPTIMIZER))
@pytest.mark.slow
def test_inject_hyperparams_with_scheduled_learning_rate(name, kwargs):
    lr0 = kwargs["learning_rate"]
    sched = schedules.linear(lr0, lr0 / 10, total_iters=3)
    others = {k: v for k, v in kwargs.items() if k != "learning_rate"}
    injected = optax.inject_hyperparams(optimizers.OPTIMIZERS[name])(learning_rate=sched, **others)
    params = ref_params = _generic_params(name)
    state = injected.init(params)
    update = jax.jit(injected.update)
    # the same steps with the scheduled value passed to the plain factory
    ref_update = jax.jit(
        lambda lr, g, s, p: optimizers.OPTIMIZERS[name](learning_rate=lr, **others).update(g, s, p)
    )
    ref_state = optimizers.OPTIMIZERS[name](**kwargs).init(ref_params)
    for k in range(3):
        grads = _generic_grads(params, k)
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        ref_updates, ref_state = ref_update(sched(k), grads, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, ref_updates)
    assert int(state.count) == 3
    for p, r in zip(params, ref_params):
        np.testing.assert_allclose(np.asarray(p), np.asarray(r), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name,kwargs", marked_cases(ALL_OPTIONS, ids=map(_case_id, ALL_OPTIONS), slow={"muon-"})
)
def test_array_hyperparameters_and_apply(name, kwargs):
    """Scheduled lr / weight decay arrive as 0-dim arrays, betas as lists (JSON), and
    ``apply`` runs on flat state leaves."""
    params = _generic_params(name)
    grads = _generic_grads(params, 0)
    as_arrays = {
        k: (
            jnp.asarray(v, jnp.float32)
            if k in ("learning_rate", "weight_decay")
            else list(v)
            if isinstance(v, tuple)
            else v
        )
        for k, v in kwargs.items()
    }
    tx = optimizers.build(name, kwargs)
    state = tx.init(params)
    want_u, want_s = tx.update(grads, state, params)
    new_params, new_leaves = optimizers.apply(
        name, as_arrays, params, grads, jax.tree.leaves(state)
    )
    for p, u, n in zip(params, want_u, new_params):
        np.testing.assert_allclose(np.asarray(n), np.asarray(p + u), rtol=1e-6, atol=1e-7)
        assert n.dtype == p.dtype
    for a, b in zip(jax.tree.leaves(want_s), new_leaves):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)
        assert a.dtype == b.dtype and a.shape == b.shape


@pytest.mark.parametrize("name", ["adam", "adamax", "lamb", "lion", "nadam", "radam"])
def test_betas_as_list(name):
    params = _generic_params(name)
    grads = _generic_grads(params, 0)
    results = []
    for betas in [(0.8, 0.9), [0.8, 0.9]]:
        tx = optimizers.build(name, {"betas": betas})
        updates, _ = tx.update(grads, tx.init(params), params)
        results.append(updates)
    for a, b in zip(*results):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ------------------------------------------------------------------ torch.optim cross-checks
# Options the fixture does not cover, for optimizers whose cstorch maths is torch's.
TORCH_CROSS = [
    (
        "adadelta",
        {"lr": 0.5, "rho": 0.8, "eps": 1e-6, "weight_decay": 0.1, "maximize": True},
        torch.optim.Adadelta,
    ),
    (
        "adagrad",
        {
            "lr": 0.1,
            "lr_decay": 0.05,
            "weight_decay": 0.1,
            "initial_accumulator_value": 0.2,
            "eps": 1e-6,
            "maximize": True,
        },
        torch.optim.Adagrad,
    ),
    (
        "adamax",
        {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1, "maximize": True},
        torch.optim.Adamax,
    ),
    (
        "asgd",
        {"lr": 0.05, "lambd": 1e-2, "alpha": 0.5, "t0": 3.0, "weight_decay": 0.1, "maximize": True},
        torch.optim.ASGD,
    ),
    (
        "radam",
        {"lr": 0.01, "betas": (0.9, 0.9), "eps": 1e-6, "weight_decay": 0.1},
        torch.optim.RAdam,
    ),  # beta2 = 0.9 reaches the rectified branch (rho_t > 5) at step 6
    (
        "rmsprop",
        {
            "lr": 0.01,
            "alpha": 0.9,
            "eps": 1e-8,
            "weight_decay": 0.1,
            "momentum": 0.5,
            "centered": True,
        },
        torch.optim.RMSprop,
    ),
    ("rmsprop", {"lr": 0.01, "alpha": 0.9, "eps": 1e-8}, torch.optim.RMSprop),
    ("rprop", {"lr": 0.05, "etas": (0.4, 1.5), "step_sizes": (1e-3, 0.08)}, torch.optim.Rprop),
]


@pytest.mark.parametrize(
    "name,kwargs,torch_cls", TORCH_CROSS, ids=[f"{c[0]}-{i}" for i, c in enumerate(TORCH_CROSS)]
)
def test_matches_torch_optim(name, kwargs, torch_cls):
    w, b = _W.clone().requires_grad_(), _B.clone().requires_grad_()
    opt = torch_cls([w, b], **kwargs)
    tx = optimizers.OPTIMIZERS[name](**_factory_kwargs(kwargs))
    params = _params()
    state = tx.init(params)
    for step in range(12):
        opt.zero_grad()
        ((_X @ w + b - _T) ** 2).mean().backward()
        opt.step()
        updates, state = tx.update(_grad(params), state, params)
        params = optax.apply_updates(params, updates)
        for p, ref in zip(params, (w, b)):
            assert _rel_err(p, ref.detach().numpy()) < 1e-5, (name, step)


# ------------------------------------------------------------------ hand-written references
def _adam_reference(params, grads_seq, lr, betas, eps, l2, wd, amsgrad):
    """cstorch AdamBase in numpy float64."""
    b1, b2 = betas
    ps = [np.asarray(p, np.float64) for p in params]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    vmax = [np.zeros_like(p) for p in ps]
    for t, grads in enumerate(grads_seq, start=1):
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64) + l2 * ps[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            vmax[i] = np.maximum(vmax[i], v[i])
            denom = np.sqrt(vmax[i] if amsgrad else v[i]) + eps
            u = m[i] / denom * np.sqrt(1 - b2**t) / (1 - b1**t) + wd * ps[i]
            ps[i] = ps[i] - lr * u
    return ps


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_amsgrad_against_numpy(amsgrad):
    params = _generic_params("adam")
    grads_seq = [_generic_grads(params, s) for s in range(5)]
    grads_seq[3] = [g * 0.01 for g in grads_seq[3]]  # v drops, so vmax matters
    tx = optimizers.adam(
        learning_rate=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.05, amsgrad=amsgrad
    )
    state, ps = tx.init(params), params
    for grads in grads_seq:
        updates, state = tx.update(grads, state, ps)
        ps = optax.apply_updates(ps, updates)
    want = _adam_reference(params, grads_seq, 0.01, (0.9, 0.99), 1e-6, 0.05, 0.0, amsgrad)
    for p, w in zip(ps, want):
        np.testing.assert_allclose(np.asarray(p), w, rtol=1e-5, atol=1e-6)


def _torch_newton_schulz(G, steps):
    """Muon's Newton–Schulz iteration, as written in the reference (torch, bfloat16)."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    transpose = G.size(-2) > G.size(-1)
    if transpose:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.mT if transpose else X


def _torch_muon(params, grads_seq, lr, weight_decay, momentum, nesterov, ns_steps):
    """The reference Muon step with its momentum buffer written back (the fix)."""
    ps = [torch.tensor(np.asarray(p)) for p in params]
    bufs = [torch.zeros_like(p) for p in ps]
    for grads in grads_seq:
        for i, (p, g) in enumerate(zip(ps, grads)):
            g = torch.tensor(np.asarray(g))
            bufs[i] = bufs[i] * momentum + g * (1 - momentum)
            eff = g + bufs[i] * momentum if nesterov else bufs[i]
            if eff.ndim == 4:
                eff = eff.view(len(eff), -1)
            eff = _torch_newton_schulz(eff, ns_steps).contiguous().view_as(p)
            rows, cols = p.shape[:2]
            adjusted = lr * (0.2 * max(rows, cols) ** 0.5)
            p.mul_(1 - adjusted * weight_decay)
            p.add_(-adjusted * eff)
    return [p.numpy() for p in ps], [b.numpy() for b in bufs]


@pytest.mark.parametrize("nesterov,ns_steps", [(True, 5), (False, 3)])
@pytest.mark.slow
def test_muon_against_reference_formula(nesterov, ns_steps):
    rs = np.random.RandomState(0)
    shapes = [(4, 3), (6, 9), (2, 3, 2, 2), (3, 4, 5)]
    params = [jnp.asarray(rs.randn(*s).astype(np.float32)) for s in shapes]
    grads_seq = [[jnp.asarray(rs.randn(*s).astype(np.float32)) for s in shapes] for _ in range(4)]
    tx = optimizers.muon(
        learning_rate=0.02, weight_decay=0.01, momentum=0.9, nesterov=nesterov, ns_steps=ns_steps
    )
    state, ps = tx.init(params), params
    update = jax.jit(tx.update)
    for grads in grads_seq:
        updates, state = update(grads, state, ps)
        ps = optax.apply_updates(ps, updates)
    want_ps, want_bufs = _torch_muon(params, grads_seq, 0.02, 0.01, 0.9, nesterov, ns_steps)
    for p, w, p0 in zip(ps, want_ps, params):
        moved = np.abs(w - np.asarray(p0)).max()
        assert np.abs(np.asarray(p) - w).max() <= 1e-4 * moved
    for b, w in zip(state.momentum_buffer, want_bufs):  # persisted (the reference drops it)
        np.testing.assert_allclose(np.asarray(b), w, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_newton_schulz_orthogonalises():
    g = jax.random.normal(jax.random.PRNGKey(0), (16, 8))
    o = np.asarray(jax.jit(optimizers.newton_schulz5)(g), np.float32)
    s = np.linalg.svd(o, compute_uv=False)
    assert float(s.min()) > 0.5 and float(s.max()) < 1.3


def test_muon_rejects_vectors():
    tx = optimizers.muon()
    params = [jnp.ones((3,))]
    with pytest.raises(ValueError, match="2 or more dimensions"):
        tx.update([jnp.ones((3,))], tx.init(params), params)


def test_adafactor_rejects_relative_step():
    with pytest.raises(ValueError, match="relative_step"):
        optimizers.adafactor(learning_rate=None, relative_step=True)


def test_state_length_mismatch_is_explained():
    tx = optimizers.adam()
    state = tx.init([jnp.ones(2)])
    with pytest.raises(ValueError, match="call init"):
        tx.update([jnp.ones(2), jnp.ones(2)], state, [jnp.ones(2), jnp.ones(2)])


def test_module_doctests():
    result = doctest.testmod(optimizers, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize(
    "name,kwargs",
    marked_cases(ONE_PER_OPTIMIZER, ids=map(_case_id, ONE_PER_OPTIMIZER), slow={"muon-"}),
)
def test_a_flax_style_dict_of_params_trains_as_the_list_does(name, kwargs):
    # optax transformations take any pytree of parameters; so do these.
    leaves = _generic_params(name)
    names = ["kernel", "scale", "bias"][: len(leaves)]
    tree = {"params": {"Dense_0": {n: a for n, a in zip(names, leaves)}}}
    as_list = jax.tree.leaves(tree)  # the same arrays, in the dict's leaf order
    tx = optimizers.OPTIMIZERS[name](**kwargs)
    update = jax.jit(tx.update)
    tree_state, list_state = tx.init(tree), tx.init(as_list)
    for k in range(3):
        tree_grads = jax.tree.map(
            lambda p, g: g,
            tree,
            jax.tree.unflatten(jax.tree.structure(tree), _generic_grads(as_list, k)),
        )
        updates, tree_state = update(tree_grads, tree_state, tree)
        assert jax.tree.structure(updates) == jax.tree.structure(tree)
        tree = optax.apply_updates(tree, updates)
        list_updates, list_state = update(jax.tree.leaves(tree_grads), list_state, as_list)
        as_list = optax.apply_updates(as_list, list_updates)
    for got, want in zip(jax.tree.leaves(tree), as_list):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for got, want in zip(jax.tree.leaves(tree_state), jax.tree.leaves(list_state)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_pytree_params_and_grads_must_match():
    tx = optimizers.adamw(1e-3)
    params = {"a": jnp.ones(2), "b": jnp.ones(3)}
    state = tx.init(params)
    with pytest.raises(ValueError, match="grads has 1 arrays but params has 2"):
        tx.update({"a": jnp.ones(2)}, state, params)
