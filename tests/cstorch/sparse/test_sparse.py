"""cstorch.sparse: the reference's sparse trajectories through compiled steps, one program
across mask updates (CPU and CSX), bit-identical resume, and the API's checks.

Oracle: ``tests/data/reference-2.10/sparsity_trajectories.json``, recorded with
cerebras-pytorch 2.10 on CPU on the problem its ``"problem"`` field describes (rebuilt by
``_problem``). The fixture names each case but not its arguments; the configurations below are
the ones its records pin down: the mask counts give the sparsity levels, the steps at which
masks change give the update schedules, and the RigL masks (deterministic) fix the drop
fractions (``rigl_topk`` records no change at step 12, so its schedule stops before it).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import cstorch
from cstorch import sparse
from tests.paths import DATA
from tests.reference_data import REFERENCE

FIXTURE = json.loads((REFERENCE / "sparsity_trajectories.json").read_text())["cases"]

CASES = {
    "static_topk_0.5": lambda: sparse.Static(sparsity=0.5, init_method="topk"),
    "static_random_0.7": lambda: sparse.Static(sparsity=0.7),
    "gmp_linear": lambda: sparse.GMP(
        sparsity={"type": "linear", "init": 0.0, "slope": 0.05}, update={"freq": 2}
    ),
    "configure_dict": lambda: sparse.configure(
        {
            "algorithm": "rigl",
            "sparsity": 0.6,
            "init_method": "topk",
            "drop_fraction": 0.25,
            "update": {"freq": 4},
        }
    ),
    "set_topk": lambda: sparse.SET(sparsity=0.5, init_method="topk", update={"freq": 3}),
    "rigl_topk": lambda: sparse.RigL(
        sparsity=0.5, init_method="topk", update={"freq": 3, "stop": 12}
    ),
}
RANDOM = {"static_random_0.7", "set_topk"}  # masks drawn from a different RNG stream


def _problem():
    """The fixture's problem: MLP 12-16-3 initialised after torch.manual_seed(0); x from a
    generator seeded 3; full-batch labels."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 12, generator=g)
    y = (x[:, :4].sum(-1) > 0).long() + (x[:, 4] > 0.5).long()
    return model, x, y


def _setup(make_sparsity, kind="CPU"):
    backend = cstorch.backend(kind) if cstorch.backend() is None else cstorch.backend()
    model, x, y = _problem()
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sparsity = make_sparsity()
    model.apply(sparsity)
    optimizer.apply(sparsity)

    @cstorch.trace
    def step(xb, yb):
        loss = torch.nn.functional.cross_entropy(compiled(xb), yb)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return model, optimizer, sparsity, step, x, y


def _train(make_sparsity, steps=12, kind="CPU"):
    """Runs the fixture's loop in a DataExecutor; per step: loss, masks, weights."""
    model, optimizer, sparsity, step, x, y = _setup(make_sparsity, kind)
    loader = cstorch.utils.data.DataLoader(lambda: [(x, y)] * steps)  # full batch each step
    record = {"losses": [], "masks": [], "weights": []}

    @cstorch.step_closure
    def keep(loss):
        record["losses"].append(float(loss))

    for xb, yb in cstorch.utils.data.DataExecutor(loader, num_steps=steps):
        keep(step(xb, yb))
        state = model.state_dict()
        record["masks"].append(
            {k[: -len("_mask")]: v.clone() for k, v in state.items() if k.endswith("_mask")}
        )
        record["weights"].append(
            {k: v.clone() for k, v in state.items() if not k.endswith("_mask")}
        )
        del state  # kept across the next step, it would be an alias the step writes through
    return record, sparsity, step


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.slow
def test_reference_trajectories(case):
    want = FIXTURE[case]
    record, sparsity, step = _train(CASES[case])
    assert step.trace_count == 1  # masks change inside the one compiled program
    assert len(record["masks"]) == len(want["masks"]) == 12
    for index, (masks, want_masks) in enumerate(zip(record["masks"], want["masks"])):
        assert sorted(masks) == sorted(want_masks), index
        for name, expected in want_masks.items():
            expected = np.asarray(expected, dtype=bool)
            got = masks[name].numpy()
            assert got.dtype == np.bool_ and got.shape == expected.shape
            assert got.sum() == expected.sum(), (case, index, name)
            if case not in RANDOM:
                np.testing.assert_array_equal(got, expected, err_msg=f"{case} {index} {name}")
        if case not in RANDOM:
            for name, expected in want["weights"][index].items():
                np.testing.assert_allclose(
                    record["weights"][index][name].numpy(),
                    np.asarray(expected, np.float32),
                    rtol=0,
                    atol=1e-5,
                    err_msg=f"{case} step {index} {name}",
                )
            # weights are pruned with the step's final mask
            for name, mask in masks.items():
                assert not record["weights"][index][name][~mask].any()
    if case not in RANDOM:
        np.testing.assert_allclose(record["losses"], want["losses"], rtol=0, atol=1e-5)
    keys = sparsity.state_dict()
    keys = [sorted(k) for k in keys] if isinstance(keys, list) else sorted(keys)
    assert keys == want["state_dict_keys"]


@pytest.mark.slow
def test_gmp_on_csx_keeps_one_program_and_the_reference_counts():
    record, _, step = _train(CASES["gmp_linear"], steps=8, kind="CSX")
    assert step.trace_count == 1
    for masks, want in zip(record["masks"], FIXTURE["gmp_linear"]["masks"]):
        for name, expected in want.items():
            assert int(masks[name].sum()) == int(np.sum(expected)), name


@pytest.mark.parametrize("case", ["rigl_topk", "set_topk"])
@pytest.mark.slow
def test_checkpoint_resume_is_bit_identical(case, tmp_path):
    model, optimizer, sparsity, step, x, y = _setup(CASES[case])
    path = tmp_path / "sparse.mdl"
    for index in range(8):
        if index == 4:
            cstorch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "sparsity": sparsity.state_dict(),
                },
                path,
            )
            rng = torch.get_rng_state()
        step(x, y)
    final = {k: v.clone() for k, v in model.state_dict().items()}
    final_state = sparsity.state_dict()
    assert step.trace_count == 1

    restored, restored_optimizer, restored_sparsity, restored_step, _, _ = _setup(CASES[case])
    state = cstorch.load(path)
    restored.load_state_dict(state["model"])
    restored_optimizer.load_state_dict(state["optimizer"])
    restored_sparsity.load_state_dict(state["sparsity"])
    torch.set_rng_state(rng)
    for _ in range(4):
        restored_step(x, y)
    got = restored.state_dict()
    assert sorted(got) == sorted(final)
    assert any(k.endswith("_mask") for k in got)
    for key, value in final.items():
        assert torch.equal(got[key], value), (case, key)
    restored_state = restored_sparsity.state_dict()
    if isinstance(final_state, dict):
        assert torch.equal(restored_state["step"], final_state["step"])


@pytest.mark.slow
def test_masks_are_buffers_under_the_reference_keys(cpu_backend):
    model, optimizer, sparsity, step, x, y = _setup(CASES["configure_dict"])
    keys = list(model.state_dict())
    assert "0.weight_mask" in keys and "2.weight_mask" in keys
    assert "0.bias_mask" not in keys  # the default filter keeps 1-d parameters dense
    step(x, y)  # initialises before the first compile (no DataExecutor)
    with pytest.warns(UserWarning, match="haphazardly"):
        mask = model[0].weight.mask
    assert mask.dtype == torch.bool and int(mask.sum()) == 76
    assert model[0].bias.mask is None
    assert torch.equal(mask, model.state_dict()["0.weight_mask"])
    assert not model.state_dict()["0.weight"][~mask].any()


@pytest.mark.slow
def test_gradients_and_optimizer_state_are_pruned(cpu_backend):
    model, optimizer, sparsity, step, x, y = _setup(CASES["static_topk_0.5"])
    step(x, y)
    state = optimizer.state_dict()["state"]
    masks = {k[:-5]: v for k, v in model.state_dict().items() if k.endswith("_mask")}
    for index, name in enumerate(["0.weight", "0.bias", "2.weight", "2.bias"]):
        buffer = state[index]["momentum_buffer"]
        assert not buffer[~masks[name]].any(), name
        assert buffer[masks[name]].abs().sum() > 0


def test_eager_forward_prunes_with_the_initialised_mask(cpu_backend):
    model, optimizer, sparsity, step, x, y = _setup(CASES["static_topk_0.5"])
    model(x)  # eager: initialises the masks and prunes the torch weights in place
    mask = model.state_dict()["0.weight_mask"]
    assert int(mask.sum()) == 96
    assert not model[0].weight.detach()[~mask].any()


@pytest.mark.slow
def test_computed_and_target_sparsity_hooks_run_in_the_step(cpu_backend):
    model, optimizer, sparsity, step, x, y = _setup(CASES["gmp_linear"])
    targets = []
    sparsity.register_target_sparsity_hook(lambda algo, name, value: targets.append(name))
    computed = []
    sparsity.register_computed_sparsity_hook(
        lambda algo, name, value: computed.append((name, value))
    )
    step(x, y)
    assert targets == ["*"]  # one schedule shared by every parameter
    assert [n for n, _ in computed] == ["0.weight", "0.bias", "2.weight", "2.bias"]


# ---------------------------------------------------------------------------- API checks
def test_needs_a_backend():
    with pytest.raises(RuntimeError, match="backend"):
        sparse.Static(sparsity=0.5)


def test_static_arguments(cpu_backend):
    with pytest.raises(ValueError, match="constant sparsity"):
        sparse.Static(sparsity=1)
    with pytest.raises(ValueError, match="0.0 <= s < 1.0"):
        sparse.Static(sparsity=1.0)
    with pytest.raises(ValueError, match="init_method"):
        sparse.Static(sparsity=0.5, init_method="nope")
    with pytest.raises(ValueError, match="init_method"):
        sparse.Static(sparsity=0.5, init_method=lambda p: p)


def test_dynamic_arguments(cpu_backend):
    with pytest.raises(ValueError, match="constant sparsity 0.5"):
        sparse.GMP(sparsity=0.5)
    with pytest.raises(ValueError, match="Invalid `update`"):
        sparse.SET(sparsity=0.5, update={"every": 3})
    model, _, _ = _problem()
    rigl = sparse.RigL(sparsity=0.5, balance_in_groups=2, balance_out_groups=2)
    with pytest.raises(ValueError, match="Only one of"):
        rigl.apply(model)
    model, _, _ = _problem()
    rigl = sparse.RigL(sparsity=0.5, balance_out_groups=5)
    with pytest.raises(ValueError, match="multiple of 5"):
        rigl.apply(model)
    with pytest.raises(ValueError, match="expected `sparsity`"):
        sparse.SET().apply(torch.nn.Linear(2, 2))


def test_apply_checks(cpu_backend):
    static = sparse.Static(sparsity=0.5)
    with pytest.raises(TypeError, match="torch.nn.Module or cstorch.optim.Optimizer"):
        static.apply(42)
    model, _, _ = _problem()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.apply(static)
    model(torch.zeros(1, 12)).sum().backward()
    with pytest.raises(RuntimeError, match="model.apply"):
        optimizer.step()


CONFIGS = [  # (config, what configure and check_config refuse it with; None: accepted)
    (0.3, None),
    ({"algorithm": "gmp", "schedule": {"type": "linear", "init": 0.0, "slope": 0.1}}, None),
    (
        [
            {"param_filter": "0.*", "sparsity": 0.5},
            {
                "param_filter": ["2.weight"],
                "algorithm": "set",
                "sparsity": 0.25,
                "drop_fraction": {"type": "cosine", "init": 0.3, "half_period": 10},
            },
        ],
        None,
    ),
    ({"sparsity": 1.5}, "Invalid sparsity level 1.5"),
    ({"algorithm": "magic", "sparsity": 0.3}, "Unsupported sparsity algorithm: magic"),
    (
        {"algorithm": "set", "sparsity": 0.3, "drop_fracton": 0.1},
        "Invalid sparsity config for SET: unknown argument 'drop_fracton'",
    ),
    ({"algorithm": "gmp", "sparsity": 0.3}, "Configured with constant sparsity 0.3"),
    ({"algorithm": "gmp", "sparsity": {"type": "lnear"}}, "Unknown schedule type 'lnear'"),
    (
        {"algorithm": "rigl", "sparsity": 0.3, "update": {"freq": 0}},
        "The update `freq` must be a positive int",
    ),
    ({"sparsity": 0.3, "init_method": "bogus"}, "Unknown `init_method`: 'bogus'"),
    ({"sparsity": 0.3, "param_filter": 3}, "filter must be"),
    ({"sparsity": 0.3, "schedule": 0.3}, "both 'sparsity' and 'schedule'"),
]


@pytest.mark.parametrize("config, refused", CONFIGS)
def test_a_sparsity_config_is_checked_without_a_backend(config, refused):
    """``configure.check_config`` refuses what ``configure`` refuses, with its message, and
    builds nothing: no backend exists before or after (issue 49, item 5)."""
    from cstorch.backend import current_backend_impl
    from cstorch.errors import NoBackendError
    from cstorch.sparse.configure import check_config

    with pytest.raises(NoBackendError):  # (an algorithm cannot be built: none is)
        current_backend_impl()
    if refused is None:
        check_config(config)
    else:
        with pytest.raises((ValueError, TypeError), match=refused):
            check_config(config)
    with pytest.raises(NoBackendError):
        current_backend_impl()


def test_configure_refuses_what_check_config_refuses_with_its_message(cpu_backend):
    for config, refused in CONFIGS:
        if refused is None:
            assert sparse.configure(config) is not None
        else:
            with pytest.raises((ValueError, TypeError), match=refused):
                sparse.configure(config)


def test_configure_forms(cpu_backend):
    group = sparse.configure(0.3)
    assert isinstance(group, sparse.Group) and isinstance(group[0], sparse.Static)
    with pytest.warns(UserWarning, match="'type' key is deprecated"):
        group = sparse.configure(
            {"type": "gmp", "schedule": {"type": "linear", "init": 0.0, "slope": 0.1}}
        )
    assert isinstance(group[0], sparse.GMP)
    with pytest.raises(ValueError, match="both 'sparsity' and 'schedule'"):
        sparse.configure({"sparsity": 0.3, "schedule": 0.3})
    with pytest.raises(ValueError, match="Unsupported sparsity algorithm: magic"):
        sparse.configure({"algorithm": "magic", "sparsity": 0.3})
    with pytest.raises(TypeError, match="filter must be"):
        sparse.configure({"sparsity": 0.3, "param_filter": 3})
    assert sparse.configure({"sparsity": None}) is None
    group = sparse.configure(
        [
            {"param_filter": "0.*", "sparsity": 0.5},
            {"param_filter": ["2.weight"], "algorithm": "set", "sparsity": 0.25},
        ]
    )
    model, _, _ = _problem()
    group.apply(model)
    assert sorted(group.sparse_params) == ["0.bias", "0.weight", "2.weight"]
    assert isinstance(group[1], sparse.SET)
    assert group.state_dict()[0] == {} and sorted(group.state_dict()[1]) == ["sparsity", "step"]
    with pytest.raises(NotImplementedError):
        group.sparsity
    with pytest.raises(ValueError, match="list of 2 state_dicts"):
        group.load_state_dict([{}])


def test_map_sparsity_algorithm():
    assert sparse.map_sparsity_algorithm("RigL") is sparse.RigL
    assert sparse.map_sparsity_algorithm("static") is sparse.Static
    with pytest.raises(ValueError, match="Supported types"):
        sparse.map_sparsity_algorithm("group")


def test_default_param_filter():
    from cstorch.sparse.configure import default_sparse_param_filter as keep

    w = torch.zeros(2, 2)
    assert keep("fc.weight", w)
    assert not keep("fc.bias", torch.zeros(2))
    for name in ("embedding.weight", "ln_norm.weight", "lm_head.weight", "pe_helper.w"):
        assert not keep(name, w)


def test_group_rejects_bad_members(cpu_backend):
    with pytest.raises(TypeError, match="SparsityAlgorithm"):
        sparse.Group({"a": 0.5})
    with pytest.raises(TypeError, match="extend"):
        sparse.Group({"a": sparse.Group({"b": sparse.Static(sparsity=0.5)})})
    with pytest.raises(RuntimeError, match="No groups"):
        sparse.Group().apply(torch.nn.Linear(2, 2))


# ------------------------------------------------------------------- schedules, init methods
def test_hyperparameter_schedules():
    from cstorch.sparse import utils

    step = torch.tensor(4)
    assert float(utils.make_hyperparam_schedule(0.3)(step)) == pytest.approx(0.3)
    linear = utils.make_hyperparam_schedule({"type": "linear", "init": 0.1, "slope": 0.05})
    assert float(linear(step)) == pytest.approx(0.3)
    exp = utils.Exp(init=0.0, gamma=-0.5, final=0.8)
    assert float(exp(step)) == pytest.approx(0.8 - 0.8 * np.exp(-2.0), rel=1e-6)
    assert float(utils.Power(init=0.5, beta=0.5)(step)) == pytest.approx(0.5**5)
    cosine = utils.Cosine(init=0.8, half_period=4, minimum=0.2)
    assert [round(float(cosine(torch.tensor(s))), 5) for s in (0, 2, 4, 8)] == [0.8, 0.5, 0.2, 0.8]
    assert cosine.get_min_max_end(0, 4) == pytest.approx((0.2, 0.8, 0.2))
    cycling = utils.make_hyperparam_schedule([0.1, 0.2, 0.3])
    values = []
    for update in (True, False, True, True):
        values.append(round(float(cycling(step)), 5))
        cycling.update(torch.tensor(update))
        cycling.update(torch.tensor(update))  # a second call in the same step is a no-op
        cycling.cache_clear()
    assert values == [0.1, 0.2, 0.2, 0.3]
    assert int(cycling.state_dict()["index"]) == 0
    assert float(utils.make_hyperparam_schedule(lambda s: s * 0.1)(step)) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="Unknown schedule type 'nope'"):
        utils.make_hyperparam_schedule({"type": "nope"})
    with pytest.raises(ValueError, match="must name its `type`"):
        utils.make_hyperparam_schedule({"init": 0.1})


def test_update_schedules():
    from cstorch.sparse import utils

    def steps(schedule):
        return [s for s in range(12) if bool(schedule(torch.tensor(s)))]

    assert steps(utils.make_update_schedule(None)) == list(range(12))
    assert steps(utils.make_update_schedule({"freq": 3, "start": 2, "stop": 9})) == [2, 5, 8]
    assert steps(utils.make_update_schedule({"steps": [1, 7]})) == [1, 7]
    assert steps(utils.make_update_schedule(lambda s: s == 4)) == [4]
    with pytest.raises(ValueError, match="positive int"):
        utils.FreqSchedule(freq=0)


def test_init_methods(cpu_backend):
    from cstorch.sparse import init

    p = torch.tensor([[1.0, -4.0, 0.0, 2.0], [0.5, 3.0, -0.1, 0.0]])
    sparsity = torch.tensor(0.5)
    np.testing.assert_array_equal(init.topk(p, sparsity).numpy(), np.abs(p.numpy()) >= 1.0)
    np.testing.assert_array_equal(init.from_zeros(p, sparsity).numpy(), p.numpy() != 0)
    assert int(init.random(p, sparsity).sum()) == 4
    board = init.checkerboard(torch.zeros(4, 8), torch.tensor(0.75))
    assert board.sum(1).tolist() == [2, 2, 2, 2] and board.sum(0).tolist() == [1] * 8
    assert init.make_init_method("topk") is init.topk
    custom = lambda p, sparsity, score_shaper=None, device=None: p != 0  # noqa: E731
    assert init.make_init_method(custom) is custom


@pytest.mark.parametrize("balance", ["out", "in"])
@pytest.mark.slow
def test_balanced_rigl_masks_stay_balanced(balance, cpu_backend):
    model, _, _ = _problem()
    compiled = cstorch.compile(model, cstorch.backend())
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    rigl = sparse.RigL(
        sparsity=0.5, init_method="topk", drop_fraction=0.5, **{f"balance_{balance}_groups": 4}
    )
    if balance == "in":
        with pytest.raises(ValueError, match="0.bias has shape \\(16,\\)"):
            sparse.RigL(sparsity=0.5, balance_in_groups=4).apply(_problem()[0])
        rigl = sparse.Group({"weight": rigl})  # names are relative to model[0]
    model[0].apply(rigl)
    optimizer.apply(rigl)
    x = torch.randn(8, 12)

    @cstorch.trace
    def step(xb):
        compiled(xb).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    masks = []
    for _ in range(3):
        step(x)
        masks.append(model.state_dict()["0.weight_mask"].clone())
    assert not torch.equal(masks[0], masks[-1])  # masks moved
    for mask in masks:  # [16, 12]: 4 groups of 4 output rows, or of 3 input columns
        groups = mask.reshape(4, -1) if balance == "out" else mask.t().reshape(4, -1)
        assert groups.sum(1).tolist() == [24, 24, 24, 24]
    assert step.trace_count == 1


@pytest.mark.slow
def test_gmp_regrowth_on_a_falling_schedule_matches_the_reference():
    """GMP on a cosine schedule that rises to 0.6 and falls again: where sparsity decreases,
    masks regrow among the pruned (zero-valued) weights exactly as the reference chooses.
    Oracle: ``tests/data/gmp_cosine_regrowth_reference.json`` (cerebras-pytorch 2.10, CPU;
    ``tests/data/make_gmp_regrowth_reference.py``)."""
    from pathlib import Path

    want = json.loads((Path(DATA) / "gmp_cosine_regrowth_reference.json").read_text())
    config = want["sparsity"]
    steps = len(want["losses"])
    record, _, step = _train(
        lambda: sparse.GMP(
            sparsity=config["sparsity"], update=config["update"], init_method=config["init_method"]
        ),
        steps=steps,
    )
    assert step.trace_count == 1
    for index in range(steps):
        for name, expected in want["masks"][index].items():
            np.testing.assert_array_equal(
                record["masks"][index][name].numpy(),
                np.asarray(expected, dtype=bool),
                err_msg=f"step {index + 1} {name}",
            )
        for name, expected in want["weights"][index].items():
            np.testing.assert_allclose(
                record["weights"][index][name].numpy(),
                np.asarray(expected, np.float32),
                rtol=0,
                atol=1e-5,
                err_msg=f"step {index + 1} {name}",
            )
    np.testing.assert_allclose(record["losses"], want["losses"], rtol=0, atol=1e-5)
