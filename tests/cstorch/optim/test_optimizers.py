"""cstorch.optim optimizers: fixture trajectories through the classes in a traced step,
construction state, argument checks, tags, zero_grad hooks, the global step, user subclasses
and checkpoint round trips that continue training bit-identically.

Trajectories come from ``tests/data/reference-2.10/optimizer_trajectories.json``
(recorded with the real cstorch 2.10 optimizers on the problem its ``"problem"`` entry
describes, the one ``tests/jax_backend/test_optimizers.py`` rebuilds).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import cstorch
from cstorch.optim import lr_scheduler, weight_decay_scheduler
from tests.jit_cache import xla_compilations
from tests.reference_data import (
    OPTIMIZER_TRAJECTORIES as TRAJECTORIES,
    optimizer_problem as _problem,
)

W, B, X, T = _problem()


class Affine(torch.nn.Module):
    """``x @ w + b`` with the fixture's initial w and b."""

    def __init__(self, with_bias=True):
        super().__init__()
        self.w = torch.nn.Parameter(W.clone())
        self.b = torch.nn.Parameter(B.clone()) if with_bias else None

    def forward(self, x):
        return x @ self.w + self.b if self.b is not None else x @ self.w


def _traced_trainer(model, optimizer, schedulers=()):
    """A compiled model plus a traced step: loss, backward, step, zero_grad, schedulers."""
    compiled = cstorch.compile(model, cstorch.backend())

    @cstorch.trace
    def step(x, t):
        loss = ((compiled(x) - t) ** 2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        for scheduler in schedulers:
            scheduler.step()
        return loss

    return step


def _rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def _params_of(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# The per-parameter key order cstorch creates (preinitialize, then the global `step`).
KEY_ORDER = {
    "SGD": [],
    "SGD_momentum": ["momentum_buffer"],
    "SGD_nesterov": ["momentum_buffer"],
    "Adam": ["exp_avg", "exp_avg_sq", "beta1_power", "beta2_power"],
    "Adam_l2": ["exp_avg", "exp_avg_sq", "beta1_power", "beta2_power"],
    "AdamW": ["exp_avg", "exp_avg_sq", "beta1_power", "beta2_power"],
    "AdamW_nobias": ["exp_avg", "exp_avg_sq"],
    "Adadelta": ["square_avg", "acc_delta"],
    "Adafactor": ["exp_avg_sq_row", "exp_avg_sq_col", "step"],
    "Adagrad": ["sum", "step"],
    "Adamax": ["exp_avg", "exp_inf", "beta1_power"],
    "ASGD": ["eta", "mu", "ax", "step"],
    "Lamb": ["exp_avg", "exp_avg_sq"],
    "Lion": ["exp_avg"],
    "NAdam": ["mu_product", "exp_avg", "exp_avg_sq", "step"],
    "RAdam": ["exp_avg", "exp_avg_sq", "step"],
    "RMSprop": ["square_avg", "momentum_buffer"],
    "Rprop": ["prev", "step_size"],
}


def test_key_order_table_covers_the_fixture():
    assert set(KEY_ORDER) == set(TRAJECTORIES)


# ------------------------------------------------------------------ fixture trajectories
@pytest.mark.parametrize("case", sorted(TRAJECTORIES))
@pytest.mark.slow
def test_fixture_trajectory_traced_and_checkpoint_continuation(case, cpu_backend, tmp_path):
    """The fixture's 6 steps through the cstorch class in a traced step; a checkpoint taken
    after step 3 restores into fresh objects that repeat steps 4-6 bit-identically."""
    entry = TRAJECTORIES[case]
    cls = getattr(cstorch.optim, entry["class"])
    model = Affine()
    optimizer = cls(model.parameters(), **entry["kwargs"])

    # state right after construction: the fixture's keys, in cstorch's insertion order
    assert sorted(optimizer.state[model.w]) == entry["state_keys"]
    assert list(optimizer.state[model.w]) == KEY_ORDER[case]
    if entry["class"] == "Adafactor":  # the 1-d bias keeps the unfactored moment
        assert list(optimizer.state[model.b]) == ["exp_avg_sq", "step"]
        assert optimizer.state[model.w]["exp_avg_sq_row"].shape == (4,)
        assert optimizer.state[model.w]["exp_avg_sq_col"].shape == (3,)

    step = _traced_trainer(model, optimizer)
    ckpt = tmp_path / "step3.mdl"
    for index, want in enumerate(entry["params_after_each_step"]):
        step(X, T)
        params = _params_of(model)
        for name, w in zip(("w", "b"), want):
            w = np.asarray(w, np.float32).reshape(params[name].shape)
            assert _rel_err(params[name], w) < 1e-5, (case, index, name)
            np.testing.assert_allclose(
                params[name].numpy(), w, rtol=1e-5, atol=1e-7, err_msg=f"{case} step {index} {name}"
            )
        if index == 2:
            cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, ckpt)
    assert step.trace_count == 1 and xla_compilations(step) == 1
    final_params = _params_of(model)
    final_state = optimizer.state_dict()["state"]

    restored = Affine()
    restored_optimizer = cls(restored.parameters(), **entry["kwargs"])
    state = cstorch.load(ckpt)
    restored.load_state_dict(state["model"])
    restored_optimizer.load_state_dict(state["optimizer"])
    restored_step = _traced_trainer(restored, restored_optimizer)
    for _ in range(3):
        restored_step(X, T)
    for name, value in _params_of(restored).items():
        assert torch.equal(value, final_params[name]), (case, name)
    restored_state = restored_optimizer.state_dict()["state"]
    for index, keys in final_state.items():
        assert list(restored_state[index]) == list(keys)
        for key, value in keys.items():
            assert torch.equal(restored_state[index][key], value), (case, index, key)


@pytest.mark.parametrize("case", ["SGD_nesterov", "Adam_l2", "Adafactor", "NAdam", "Rprop"])
@pytest.mark.slow
def test_fixture_trajectory_eager(case, cpu_backend):
    """The same classes outside a traced step (the op's eager implementation)."""
    entry = TRAJECTORIES[case]
    model = Affine()
    optimizer = getattr(cstorch.optim, entry["class"])(model.parameters(), **entry["kwargs"])
    for index, want in enumerate(entry["params_after_each_step"]):
        optimizer.zero_grad()
        ((model(X) - T) ** 2).mean().backward()
        optimizer.step()
        for p, w in zip((model.w, model.b), want):
            w = np.asarray(w, np.float32).reshape(p.shape)
            assert _rel_err(p.detach(), w) < 1e-5, (case, index)


# ------------------------------------------------------------------ Muon
def _muon_reference(params, grads_seq, lr, weight_decay, momentum, nesterov, ns_steps):
    """The pure rule applied step by step."""
    import jax.numpy as jnp
    import optax

    from jax_backend import optimizers

    tx = optimizers.muon(
        learning_rate=lr,
        weight_decay=weight_decay,
        momentum=momentum,
        nesterov=nesterov,
        ns_steps=ns_steps,
    )
    ps = [jnp.asarray(p.numpy()) for p in params]
    state = tx.init(ps)
    for grads in grads_seq:
        updates, state = tx.update([jnp.asarray(g.numpy()) for g in grads], state, ps)
        ps = optax.apply_updates(ps, updates)
    return [np.asarray(p) for p in ps]


@pytest.mark.slow
def test_muon_traced_matches_the_pure_rule_and_survives_a_checkpoint(cpu_backend, tmp_path):
    model = Affine(with_bias=False)
    optimizer = cstorch.optim.Muon(model.parameters(), lr=0.02, momentum=0.9, ns_steps=3)
    assert list(optimizer.state[model.w]) == ["momentum_buffer"]
    step = _traced_trainer(model, optimizer)
    for _ in range(4):
        step(X, T)
    # the same 4 steps with the pure rule, gradients computed by torch
    grads_seq, expected_w = [], W.clone()
    for _ in range(4):
        w = expected_w.clone().requires_grad_()
        ((X @ w - T) ** 2).mean().backward()
        grads_seq.append([w.grad])
        expected_w = torch.tensor(_muon_reference([W], grads_seq, 0.02, 0.01, 0.9, True, 3)[0])
    got = model.state_dict()["w"]
    assert _rel_err(got, expected_w.numpy()) < 1e-5
    buffer = optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.count_nonzero(buffer) > 0  # persisted (the reference drops it)

    path = tmp_path / "muon.mdl"
    cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    del got, buffer  # kept across the step, they would be aliases the step writes through
    step(X, T)
    restored = Affine(with_bias=False)
    restored_optimizer = cstorch.optim.Muon(
        restored.parameters(), lr=0.02, momentum=0.9, ns_steps=3
    )
    state = cstorch.load(path)
    restored.load_state_dict(state["model"])
    restored_optimizer.load_state_dict(state["optimizer"])
    _traced_trainer(restored, restored_optimizer)(X, T)
    assert torch.equal(restored.state_dict()["w"], model.state_dict()["w"])


def test_muon_rejects_vectors(cpu_backend):
    model = Affine()
    optimizer = cstorch.optim.Muon(model.parameters())
    ((model(X) - T) ** 2).mean().backward()
    with pytest.raises(ValueError, match=r"2 or more dimensions.*\(3,\)"):
        optimizer.step()


# ------------------------------------------------------------------ construction
ALL_CLASSES = [
    "Adadelta",
    "Adafactor",
    "Adagrad",
    "Adamax",
    "Adam",
    "AdamW",
    "ASGD",
    "Lamb",
    "Lion",
    "Muon",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "SGD",
]
REQUIRED = {"SGD": {"lr": 0.1}, "Adafactor": {"lr": 0.1}}


def test_exports():
    assert cstorch.optim.__all__ == ["Optimizer"] + ALL_CLASSES[:4] + [
        "Adam",
        "AdamW",
        "ASGD",
        "Lamb",
        "Lion",
        "Muon",
        "NAdam",
        "RAdam",
        "RMSprop",
        "Rprop",
        "SGD",
        "scheduler",
        "lr_scheduler",
        "weight_decay_scheduler",
    ]
    for name in cstorch.optim.__all__:
        assert getattr(cstorch.optim, name) is not None
    import cerebras.pytorch as reference_name

    assert reference_name.optim.AdamW is cstorch.optim.AdamW


@pytest.mark.parametrize("name", ALL_CLASSES)
def test_constructing_without_a_backend_raises(name):
    p = torch.nn.Parameter(torch.zeros(2, 2))
    with pytest.raises(RuntimeError, match="backend"):
        getattr(cstorch.optim, name)([p], **REQUIRED.get(name, {}))


@pytest.mark.parametrize("name", ALL_CLASSES)
def test_negative_learning_rate(name, cpu_backend):
    p = torch.nn.Parameter(torch.zeros(2, 2))
    cls = getattr(cstorch.optim, name)
    if name == "Adafactor":  # the one optimizer that does not check lr
        cls([p], lr=-1.0)
        return
    with pytest.raises(ValueError, match="-1.0"):
        cls([p], lr=-1.0)


BAD_ARGUMENTS = [
    ("SGD", {"lr": 0.1, "momentum": -0.1}, "momentum"),
    ("SGD", {"lr": 0.1, "weight_decay": -0.1}, "weight_decay"),
    ("SGD", {"lr": 0.1, "nesterov": True}, "Nesterov"),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "nesterov": True}, "dampening"),
    ("Adam", {"betas": (1.0, 0.999)}, "beta"),
    ("Adam", {"betas": (0.9, -0.1)}, "beta"),
    ("Adam", {"eps": -1e-8}, "epsilon"),
    ("AdamW", {"betas": (0.9, 1.5)}, "beta"),
    ("Adadelta", {"rho": 1.5}, "rho"),
    ("Adadelta", {"eps": -1.0}, "epsilon"),
    ("Adadelta", {"weight_decay": -1.0}, "weight_decay"),
    ("Adafactor", {"lr": 0.1, "relative_step": True}, "relative_step"),
    ("Adafactor", {"lr": None, "relative_step": True}, "relative_step"),
    ("Adafactor", {"lr": 0.1, "warmup_init": True}, "warmup_init"),
    ("Adafactor", {"lr": 0.1, "clip_threshold": 2.0}, "clip_threshold"),
    ("Adafactor", {"lr": 0.1, "beta1": 0.9}, "beta1"),
    ("Adafactor", {"lr": 0.1, "eps": (1e-30,)}, "eps"),
    ("Adafactor", {"lr": 0.1, "eps": (1, 1e-3)}, "eps"),
    ("Adagrad", {"lr_decay": -1.0}, "lr_decay"),
    ("Adagrad", {"weight_decay": -1.0}, "weight_decay"),
    ("Adagrad", {"initial_accumulator_value": -1.0}, "initial_accumulator_value"),
    ("Adagrad", {"eps": -1.0}, "epsilon"),
    ("Adamax", {"betas": (0.9, 1.0)}, "beta"),
    ("Adamax", {"eps": -1.0}, "epsilon"),
    ("ASGD", {"weight_decay": -1.0}, "weight_decay"),
    ("Lamb", {"eps": -1.0}, "epsilon"),
    ("Lamb", {"betas": (-0.1, 0.9)}, "beta"),
    ("Lion", {"betas": (0.9, 1.0)}, "beta"),
    ("Lion", {"weight_decay": -1.0}, "weight decay"),
    ("Muon", {"weight_decay": 1.0}, "weight decay"),
    ("Muon", {"momentum": 1.0}, "momentum"),
    ("Muon", {"ns_steps": -1}, "steps"),
    ("NAdam", {"eps": -1.0}, "epsilon"),
    ("NAdam", {"betas": (0.9, 1.0)}, "beta"),
    ("NAdam", {"weight_decay": -1.0}, "weight_decay"),
    ("NAdam", {"momentum_decay": -1.0}, "momentum_decay"),
    ("RAdam", {"betas": (1.0, 0.9)}, "beta"),
    ("RAdam", {"weight_decay": -1.0}, "weight_decay"),
    ("RAdam", {"eps": -1.0}, "epsilon"),
    ("RMSprop", {"eps": -1.0}, "epsilon"),
    ("RMSprop", {"momentum": -1.0}, "momentum"),
    ("RMSprop", {"weight_decay": -1.0}, "weight_decay"),
    ("RMSprop", {"alpha": -1.0}, "alpha"),
]


@pytest.mark.parametrize(
    "name,kwargs,text", BAD_ARGUMENTS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_ARGUMENTS)]
)
def test_argument_checks(name, kwargs, text, cpu_backend):
    p = torch.nn.Parameter(torch.zeros(2, 2))
    with pytest.raises(ValueError, match=text):
        getattr(cstorch.optim, name)([p], **kwargs)


@pytest.mark.parametrize("name", ["SGD", "Adafactor"])
def test_lr_is_required(name, cpu_backend):
    with pytest.raises(TypeError, match="lr"):
        getattr(cstorch.optim, name)([torch.nn.Parameter(torch.zeros(2))])


def test_state_right_after_construction(cpu_backend):
    p = torch.nn.Parameter(torch.ones(2, 3))
    assert dict(cstorch.optim.SGD([p], lr=0.1).state) == {}
    state = cstorch.optim.SGD([p], lr=0.1, momentum=0.9).state[p]
    assert list(state) == ["momentum_buffer"] and torch.equal(
        state["momentum_buffer"], torch.zeros(2, 3)
    )
    state = cstorch.optim.Adam([p]).state[p]
    assert list(state) == ["exp_avg", "exp_avg_sq", "beta1_power", "beta2_power"]
    assert state["beta1_power"].item() == pytest.approx(0.9)
    assert state["beta2_power"].item() == pytest.approx(0.999)
    assert state["beta1_power"].shape == () and state["beta1_power"].dtype == torch.float32
    assert list(cstorch.optim.Adam([p], amsgrad=True).state[p]) == [
        "exp_avg",
        "exp_avg_sq",
        "max_exp_avg_sq",
        "beta1_power",
        "beta2_power",
    ]
    state = cstorch.optim.Adagrad([p], initial_accumulator_value=0.5).state[p]
    assert list(state) == ["sum", "step"]
    assert torch.equal(state["sum"], torch.full((2, 3), 0.5))
    assert state["step"].dtype == torch.float32 and state["step"].item() == 0.0
    state = cstorch.optim.ASGD([p], lr=0.05).state[p]
    assert state["eta"].item() == pytest.approx(0.05) and state["mu"].item() == 1.0
    state = cstorch.optim.Rprop([p], lr=0.05).state[p]
    assert torch.equal(state["step_size"], torch.full((2, 3), 0.05))
    assert list(cstorch.optim.RMSprop([p], momentum=0.5, centered=True).state[p]) == [
        "square_avg",
        "momentum_buffer",
        "grad_avg",
    ]
    assert list(cstorch.optim.Muon([p], momentum=0.0).state[p]) == []
    for name, flag in [
        ("SGD", False),
        ("Adafactor", True),
        ("Adagrad", True),
        ("ASGD", True),
        ("NAdam", True),
        ("RAdam", True),
        ("Adam", False),
        ("Lion", False),
    ]:
        optimizer = getattr(cstorch.optim, name)([p], **REQUIRED.get(name, {}))
        assert optimizer.enable_global_step is flag, name


def test_defaults_follow_cstorch(cpu_backend):
    p = torch.nn.Parameter(torch.zeros(2))
    group = cstorch.optim.Adam([p], weight_decay=0.1).param_groups[0]
    assert group["weight_decay"] == 0.0 and group["l2_regularization_rate"] == 0.1
    assert group["correct_bias"] is True and group["eps"] == 1e-6
    assert (
        cstorch.optim.AdamW([p], weight_decay=0.1).param_groups[0]["l2_regularization_rate"] == 0.0
    )
    for name in ["Adam", "AdamW", "Adamax", "Adagrad", "Lamb", "RAdam", "Adadelta"]:
        assert getattr(cstorch.optim, name)([p]).param_groups[0]["eps"] == 1e-6, name
    assert cstorch.optim.NAdam([p]).param_groups[0]["eps"] == 1e-8


def test_tags_become_sets(cpu_backend):
    a, b, c = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    optimizer = cstorch.optim.SGD(
        [{"params": [a], "tags": ["x", "y"]}, {"params": [b], "tags": "x"}, {"params": [c]}], lr=0.1
    )
    assert optimizer.param_groups[0]["tags"] == {"x", "y"}
    assert optimizer.param_groups[1]["tags"] == {"x"}
    assert "tags" not in optimizer.param_groups[2]
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))], "tags": ("z",)})
    assert optimizer.param_groups[3]["tags"] == {"z"}
    # tags survive a state_dict round trip
    restored = cstorch.optim.SGD(
        [
            {"params": [a]},
            {"params": [b]},
            {"params": [c]},
            {"params": [torch.nn.Parameter(torch.zeros(1))]},
        ],
        lr=0.1,
    )
    restored.load_state_dict(optimizer.state_dict())
    assert [g.get("tags") for g in restored.param_groups] == [{"x", "y"}, {"x"}, None, {"z"}]


def test_adafactor_needs_a_learning_rate_at_step_time(cpu_backend):
    model = Affine()
    optimizer = cstorch.optim.Adafactor(model.parameters(), lr=None)
    ((model(X) - T) ** 2).mean().backward()
    with pytest.raises(ValueError, match="learning rate"):
        optimizer.step()


def test_sparse_gradients_are_rejected(cpu_backend):
    p = torch.nn.Parameter(torch.zeros(3, 2))
    optimizer = cstorch.optim.Adagrad([p])
    p.grad = torch.zeros(3, 2).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        optimizer.step()


def test_missing_state_is_named(cpu_backend):
    p = torch.nn.Parameter(torch.zeros(2))
    optimizer = cstorch.optim.SGD([p], lr=0.1, momentum=0.9)
    del optimizer.state[p]["momentum_buffer"]
    p.grad = torch.ones(2)
    with pytest.raises(RuntimeError, match="momentum_buffer"):
        optimizer.step()


def test_adam_loads_a_torch_state_with_step(cpu_backend):
    model = Affine()
    reference = torch.optim.Adam(model.parameters(), lr=0.01, eps=1e-6)
    for _ in range(3):
        reference.zero_grad()
        ((model(X) - T) ** 2).mean().backward()
        reference.step()
    state = reference.state_dict()
    for group in state["param_groups"]:
        group["correct_bias"] = True
    optimizer = cstorch.optim.Adam(model.parameters(), lr=0.01)
    optimizer.load_state_dict(state)
    assert (
        "step" in state["state"][0] and "l2_regularization_rate" not in state["param_groups"][0]
    )  # the caller's dict is left as it was
    loaded = optimizer.state[model.w]
    assert "step" not in loaded
    # after 3 torch steps the next update uses the bias correction of step 4
    assert loaded["beta1_power"].item() == pytest.approx(0.9**4)
    assert loaded["beta2_power"].item() == pytest.approx(0.999**4)


def test_load_state_dict_copies_tensors(cpu_backend):
    p = torch.nn.Parameter(torch.zeros(2))
    source = cstorch.optim.Adagrad([p])
    target = cstorch.optim.Adagrad([p])
    target.load_state_dict(source.state_dict())
    assert target.state[p]["step"] is not source.state[p]["step"]
    target.state[p]["step"].add_(1.0)
    assert source.state[p]["step"].item() == 0.0


# ------------------------------------------------------------------ zero_grad hooks
def test_zero_grad_hooks(cpu_backend):
    p = torch.nn.Parameter(torch.zeros(2))
    optimizer = cstorch.optim.SGD([p], lr=0.1)
    events = []

    def pre(opt, args, kwargs):
        events.append(("pre", p.grad is not None))
        return args, dict(kwargs, set_to_none=True)

    def post(opt, args, kwargs):
        events.append(("post", p.grad is not None, kwargs))

    handles = [
        optimizer.register_zero_grad_pre_hook(pre),
        optimizer.register_zero_grad_post_hook(post),
    ]
    p.grad = torch.ones(2)
    optimizer.zero_grad()
    # the post hook runs after the grads are zeroed (the reference ran it before)
    assert events == [("pre", True), ("post", False, {"set_to_none": True})]
    for handle in handles:
        handle.remove()
    p.grad = torch.ones(2)
    optimizer.zero_grad()
    assert len(events) == 2 and p.grad is None

    optimizer.register_zero_grad_pre_hook(lambda *a: "bad")
    with pytest.raises(RuntimeError, match="must return None or a tuple"):
        optimizer.zero_grad()


def test_apply_and_visit_state(cpu_backend):
    p = torch.nn.Parameter(torch.ones(2))
    optimizer = cstorch.optim.SGD([p], lr=0.1, momentum=0.9)
    assert optimizer.apply(lambda o: o is optimizer)

    class Visitor:
        def apply(self, opt):
            return "applied"

    assert optimizer.apply(Visitor()) == "applied"
    with pytest.raises(TypeError, match="int"):
        optimizer.apply(42)
    optimizer.visit_state(lambda t: t + 1.0)
    assert torch.equal(optimizer.state[p]["momentum_buffer"], torch.ones(2))


# ------------------------------------------------------------------ user subclasses
class SignMomentum(cstorch.optim.Optimizer):
    """Momentum on the gradient's sign with a linear warm-up over the global step, in torch
    ops: state created in preinitialize, updated in place."""

    def __init__(self, params, lr=0.05, beta=0.8, warmup=3.0):
        super().__init__(params, dict(lr=lr, beta=beta, warmup=warmup), enable_global_step=True)

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["buf"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                step = self.increment_global_step(p)
                warm = torch.where(
                    step < group["warmup"], step / group["warmup"], torch.ones_like(step)
                )
                buf = self.state[p]["buf"]
                buf.mul_(group["beta"]).add_(torch.sign(p.grad), alpha=1 - group["beta"])
                p.sub_(buf * warm * group["lr"])


class HalvingLR(lr_scheduler.LRScheduler):
    """``initial_learning_rate·0.5^floor(t/period)``, written in torch ops."""

    def __init__(self, optimizer, initial_learning_rate, period):
        self.initial_learning_rate = initial_learning_rate
        self.period = period
        super().__init__(optimizer, total_iters=None)

    def _get_closed_form(self):
        halvings = torch.div(self.last_epoch, self.period, rounding_mode="floor")
        return torch.pow(0.5, halvings) * self.initial_learning_rate


@pytest.mark.slow
def test_user_optimizer_and_scheduler_traced_match_eager(cpu_backend):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    eager_model = copy.deepcopy(model)

    optimizer = SignMomentum(model.parameters())
    scheduler = HalvingLR(optimizer, 0.05, period=2)
    assert list(optimizer.state[model.weight]) == ["buf", "step"]
    step = _traced_trainer(model, optimizer, [scheduler])

    eager_optimizer = SignMomentum(eager_model.parameters())
    eager_scheduler = HalvingLR(eager_optimizer, 0.05, period=2)
    lrs, eager_lrs = [], []
    for _ in range(6):
        step(X, T)
        lrs.append(float(scheduler.get_last_lr()[0]))
        loss = ((eager_model(X) - T) ** 2).mean()
        loss.backward()
        eager_optimizer.step()
        eager_optimizer.zero_grad()
        eager_scheduler.step()
        eager_lrs.append(float(eager_scheduler.get_last_lr()[0]))
    assert step.trace_count == 1 and xla_compilations(step) == 1
    assert lrs == eager_lrs
    assert lrs == pytest.approx([0.05 * 0.5 ** ((k + 1) // 2) for k in range(6)], rel=1e-6)
    for name, value in model.state_dict().items():
        want = eager_model.state_dict()[name]
        assert _rel_err(value, want) < 1e-6, name
    assert optimizer.state_dict()["state"][0]["step"].item() == 6.0
    assert eager_optimizer.state[eager_model.weight]["step"].item() == 6.0


def test_increment_global_step_needs_enable_global_step(cpu_backend):
    class Plain(SignMomentum):
        def __init__(self, params):
            cstorch.optim.Optimizer.__init__(self, params, dict(lr=0.1, beta=0.5, warmup=1.0))

    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(RuntimeError, match="enable_global_step=True"):
        Plain([p]).increment_global_step(p)
    optimizer = SignMomentum([p])
    value = optimizer.increment_global_step(p)
    assert value is optimizer.state[p]["step"] and value.item() == 1.0


def test_optimizer_needs_preinitialize_and_step():
    class Incomplete(cstorch.optim.Optimizer):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Incomplete([torch.nn.Parameter(torch.zeros(1))], {})


# ------------------------------------------------------------------ with schedulers
@pytest.mark.slow
def test_scheduled_training_survives_a_checkpoint(cpu_backend, tmp_path):
    """AdamW with a scheduled lr (warm-up then cosine) and a scheduled weight decay: the state
    of model, optimizer and both schedulers restores into fresh objects, and training goes on
    bit-identically."""

    def build(model):
        optimizer = cstorch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        warmup = lr_scheduler.LinearLR(optimizer, 0.0, 0.01, total_iters=3)
        decay = lr_scheduler.CosineDecayLR(optimizer, 0.01, 0.001, total_iters=10)
        lr = lr_scheduler.SequentialLR(optimizer, [warmup, decay], milestones=[3])
        wd = weight_decay_scheduler.StepWD(optimizer, 0.1, step_size=2, gamma=0.5)
        return optimizer, [lr, wd]

    model = Affine()
    optimizer, schedulers = build(model)
    step = _traced_trainer(model, optimizer, schedulers)
    path = tmp_path / "ckpt.mdl"
    for index in range(8):
        step(X, T)
        if index == 3:
            cstorch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "lr": schedulers[0].state_dict(),
                    "wd": schedulers[1].state_dict(),
                },
                path,
            )
    groups = optimizer.state_dict()["param_groups"]  # brings the torch objects up to date
    assert groups[0]["weight_decay"].item() == pytest.approx(0.1 * 0.5**4)
    assert schedulers[0].last_epoch.item() == 8

    restored = Affine()
    restored_optimizer, restored_schedulers = build(restored)
    state = cstorch.load(path)
    restored.load_state_dict(state["model"])
    restored_optimizer.load_state_dict(state["optimizer"])
    restored_schedulers[0].load_state_dict(state["lr"])
    restored_schedulers[1].load_state_dict(state["wd"])
    assert restored_schedulers[0].last_epoch.item() == 4
    assert restored_schedulers[0].last_epoch.dtype == torch.int64
    restored_step = _traced_trainer(restored, restored_optimizer, restored_schedulers)
    for _ in range(4):
        restored_step(X, T)
    for name, value in restored.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name
    for key in ("lr", "weight_decay"):
        assert torch.equal(
            restored_optimizer.param_groups[0][key], optimizer.param_groups[0][key]
        ), key
    assert restored_schedulers[0].last_epoch.item() == 8
    assert [s.last_epoch.item() for s in restored_schedulers[0]._schedulers] == [8, 5]
