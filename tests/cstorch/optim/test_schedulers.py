"""cstorch.optim schedulers: every series of the 2.10 fixture through the scheduler classes,
eagerly and in a traced step, plus the reference's observable behaviours.

``tests/data/reference-2.10/scheduler_values.json`` holds ``lr`` of param group 0
right after construction and after each ``optimizer.step(); scheduler.step()``. The fixture
does not record constructor arguments; the ones below are those inferred in
``tests/jax_backend/test_schedules.py``.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch

import cstorch
from cstorch.optim import lr_scheduler as L, scheduler as S, weight_decay_scheduler as WD
from tests.jit_cache import xla_compilations
from tests.reference_data import REFERENCE
from tests.training import lr_recording_step

FIXTURES = REFERENCE
VALUES = json.loads((FIXTURES / "scheduler_values.json").read_text())["values"]

BUILDERS = {
    "ConstantLR": lambda o: L.ConstantLR(o, 0.1),
    "LinearLR": lambda o: L.LinearLR(o, 0.1, 0.01, total_iters=20),
    "PolynomialLR_p2": lambda o: L.PolynomialLR(o, 0.1, 0.0, total_iters=20, power=2.0),
    "ExponentialLR": lambda o: L.ExponentialLR(o, 0.1, total_iters=10, decay_rate=0.5),
    "ExponentialLR_staircase": lambda o: L.ExponentialLR(
        o, 0.1, total_iters=10, decay_rate=0.5, staircase=True
    ),
    "InverseExponentialTimeDecayLR": lambda o: L.InverseExponentialTimeDecayLR(
        o, 0.1, step_exponent=1.0, total_iters=10, decay_rate=1.0
    ),
    "InverseSquareRootDecayLR": lambda o: L.InverseSquareRootDecayLR(
        o, 1.0, scale=1.0, warmup_steps=4.0
    ),
    "CosineDecayLR": lambda o: L.CosineDecayLR(o, 0.1, 0.01, total_iters=30),
    "CosineAnnealingLR": lambda o: L.CosineAnnealingLR(o, 0.1, T_max=10, eta_min=0.001),
    "StepLR": lambda o: L.StepLR(o, 0.1, step_size=7, gamma=0.5),
    "MultiStepLR": lambda o: L.MultiStepLR(o, 0.1, gamma=0.3, milestones=[5, 12, 30]),
    "PiecewiseConstantLR": lambda o: L.PiecewiseConstantLR(o, [0.1, 0.05, 0.01], [10, 25]),
    "MultiplicativeLR": lambda o: L.MultiplicativeLR(o, 0.1, coefficient=0.9),
    "CyclicLR": lambda o: L.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=5),
    "CyclicLR_triangular2": lambda o: L.CyclicLR(
        o, base_lr=0.01, max_lr=0.1, step_size_up=4, step_size_down=6, mode="triangular2"
    ),
    "OneCycleLR": lambda o: L.OneCycleLR(
        o, 0.01, max_lr=0.1, total_steps=40, pct_start=0.3, final_div_factor=1e4
    ),
    "SequentialLR": lambda o: L.SequentialLR(
        o,
        [L.LinearLR(o, 0.0, 0.1, total_iters=8), L.CosineDecayLR(o, 0.1, 0.0, total_iters=32)],
        milestones=[8],
    ),
    "ChainedScheduler": lambda o: L.ChainedScheduler(
        [
            L.ExponentialLR(o, 0.1, total_iters=20, decay_rate=0.5),
            L.ExponentialLR(o, 2.0, total_iters=20, decay_rate=0.5),
        ]
    ),
}


def _optimizer(groups=None, **kwargs):
    if groups is None:
        groups = [torch.nn.Parameter(torch.zeros(2))]
    return cstorch.optim.SGD(groups, lr=kwargs.pop("lr", 1.0), **kwargs)


def test_every_fixture_series_has_a_builder():
    assert set(BUILDERS) == set(VALUES)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", sorted(VALUES))
def test_fixture_values(name, traced, cpu_backend):
    want = np.asarray(VALUES[name], np.float64)
    optimizer = _optimizer()
    scheduler = BUILDERS[name](optimizer)

    def step():
        optimizer.step()
        scheduler.step()

    if traced:
        step = cstorch.trace(step)
    got = [float(scheduler.get_last_lr()[0])]
    for _ in range(len(want) - 1):
        step()
        got.append(float(scheduler.get_last_lr()[0]))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    if traced:
        assert step.trace_count == 1 and xla_compilations(step) == 1
    assert scheduler.last_epoch.item() == len(want) - 1
    # the optax-compatible pure function gives the same series
    schedule_fn = scheduler.schedule_fn
    np.testing.assert_allclose(
        [float(schedule_fn(t)) for t in range(0, len(want), 7)], want[::7], rtol=0, atol=1e-7
    )


def test_values_recorded_by_a_step_closure(cpu_backend):
    optimizer = _optimizer()
    scheduler = BUILDERS["OneCycleLR"](optimizer)
    recorded = []

    @cstorch.step_closure
    def record(lr):
        recorded.append(lr.item())

    @cstorch.trace
    def step():
        optimizer.step()
        scheduler.step()
        record(optimizer.param_groups[0]["lr"])

    dataloader = cstorch.utils.data.DataLoader(lambda: [torch.zeros(1)] * 10)
    for _ in cstorch.utils.data.DataExecutor(dataloader, num_steps=10):
        step()
    np.testing.assert_allclose(recorded, VALUES["OneCycleLR"][1:11], rtol=0, atol=1e-7)


# ------------------------------------------------------------------ the reference's behaviours
def test_lr_is_a_tensor_and_last_epoch_an_int64_tensor(cpu_backend):
    optimizer = _optimizer()
    scheduler = L.LinearLR(
        optimizer, initial_learning_rate=1.0, end_learning_rate=0.0, total_iters=10
    )
    lr = optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.shape == () and lr.dtype == torch.float32
    assert lr.item() == 1.0
    assert isinstance(scheduler.last_epoch, torch.Tensor)
    assert scheduler.last_epoch.dtype == torch.int64 and scheduler.last_epoch.item() == 0
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"].item() == pytest.approx(0.5)
    assert optimizer.param_groups[0]["lr"] is lr  # written in place
    for _ in range(7):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"].item() == 0.0
    assert optimizer._step_count == 12 and scheduler._step_count == 13
    assert isinstance(scheduler, torch.optim.lr_scheduler._LRScheduler)


def test_construction_errors(cpu_backend):
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(TypeError, match="not a cstorch.optim.Optimizer"):
        L.ConstantLR(torch.optim.SGD([p], lr=0.1), 0.1)
    optimizer = _optimizer([{"params": [p], "tags": "a"}])
    with pytest.raises(ValueError, match="Available tags: {'a'}"):
        L.ConstantLR(optimizer, 0.1, param_group_tags="missing")
    with pytest.raises(ValueError, match="duplicate"):
        L.ConstantLR(optimizer, 0.1, param_group_tags=["a", "a"])


def test_get_warns_outside_step_and_tags_filter_groups(cpu_backend):
    a, b, c = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    optimizer = _optimizer(
        [{"params": [a], "tags": ["enc", "x"]}, {"params": [b]}, {"params": [c], "tags": "dec"}],
        lr=0.5,
    )
    scheduler = L.ConstantLR(optimizer, 0.1, param_group_tags="enc")
    with pytest.warns(UserWarning, match="get_last_value"):
        scheduler.get()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        last = scheduler.get_last_lr()
        scheduler.step()
    assert isinstance(last[0], torch.Tensor) and last[0].item() == pytest.approx(0.1)
    assert last[1:] == [None, None]
    assert optimizer.param_groups[1]["lr"] == 0.5  # untouched
    # [None] targets the untagged groups
    untagged = L.ConstantLR(optimizer, 0.2, param_group_tags=[None])
    assert [v is not None for v in untagged.get_last_lr()] == [False, True, False]
    assert optimizer.param_groups[1]["lr"].item() == pytest.approx(0.2)
    # get_last_lr returns copies, not the live group tensors
    assert untagged.get_last_lr()[1] is not optimizer.param_groups[1]["lr"]


def test_state_dict_keys(cpu_backend):
    scheduler = L.ConstantLR(_optimizer(), 0.1)
    state = scheduler.state_dict()
    assert {
        "learning_rate",
        "last_epoch",
        "_last_value",
        "param_group_tags",
        "total_iters",
        "_step_count",
        "_get_called_within_step",
    } <= set(state)
    assert "optimizer" not in state and "device" not in state and "val" not in state
    keys = {
        L.LinearLR: {"initial_learning_rate", "end_learning_rate", "power", "cycle"},
        L.CyclicLR: {"base_lr", "max_lr", "step_size_up", "step_size_down", "mode"},
        L.OneCycleLR: {"initial_learning_rate", "max_lr", "total_steps"},
        WD.LinearWD: {"initial_val", "end_val"},
    }
    args = {
        L.LinearLR: (1.0, 0.0, 10),
        L.CyclicLR: (0.1, 1.0),
        L.OneCycleLR: (0.1, 1.0),
        WD.LinearWD: (1.0, 0.0, 10),
    }
    for cls, expected in keys.items():
        assert expected <= set(cls(_optimizer(), *args[cls]).state_dict()), cls


def test_load_state_dict_restores_the_count(cpu_backend):
    optimizer = _optimizer()
    scheduler = L.StepLR(optimizer, 1.0, step_size=2, gamma=0.5)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    state = scheduler.state_dict()
    other = L.StepLR(_optimizer(), 1.0, step_size=2, gamma=0.5)
    other.load_state_dict(state)
    assert other.last_epoch.item() == 5 and other.last_epoch is not scheduler.last_epoch
    assert other._step_count == 1  # not restored, as in cerebras-pytorch
    other.optimizer.step()
    other.step()
    assert other.get_last_lr()[0].item() == pytest.approx(0.125)


def test_loaded_state_shares_nothing_with_the_dict_it_came_from():
    """``load_state_dict`` (of schedulers and optimizers) keeps plain copies: every tensor at
    any depth copied, every dict, list and tuple rebuilt, a namedtuple kept as its type."""
    import collections

    from cstorch.optim.optimizer import plain_copies

    Pair = collections.namedtuple("Pair", "first second")
    tensor = torch.arange(3.0)
    given = {
        "lrs": [tensor, 0.5],
        "nested": {"t": (tensor, 2)},
        "pair": Pair(tensor, 1),
        "size": torch.Size([2, 3]),
        "floats": [0.1, 0.2],
    }
    kept = plain_copies(given)
    assert kept["lrs"] is not given["lrs"] and kept["floats"] is not given["floats"]
    assert kept["floats"] == given["floats"] and kept["lrs"][1] == 0.5
    tensors = [kept["lrs"][0], kept["nested"]["t"][0], kept["pair"].first]
    assert all(t is not tensor and torch.equal(t, tensor) for t in tensors)
    assert type(kept["pair"]) is Pair and kept["pair"].second == 1
    assert kept["size"] == torch.Size([2, 3]) and type(kept["size"]) is torch.Size
    kept["lrs"][0].add_(1.0)
    assert torch.equal(tensor, torch.arange(3.0))


def test_sequential_errors_and_switch(cpu_backend):
    optimizer = _optimizer()
    first = L.ConstantLR(optimizer, 0.1)
    second = L.LinearLR(optimizer, 1.0, 0.0, total_iters=4)
    with pytest.raises(ValueError, match="number of schedulers 2"):
        L.SequentialLR(optimizer, [first, second], milestones=[5, 6])
    with pytest.raises(TypeError, match="list of integers"):
        L.SequentialLR(optimizer, [first, second], milestones=[5.0])
    with pytest.raises(TypeError, match="list of integers"):
        L.SequentialLR(optimizer, [first, second], milestones=5)
    with pytest.raises(ValueError, match="same optimizer"):
        L.SequentialLR(_optimizer(), [first, second], milestones=[5])
    with pytest.raises(ValueError, match="param_group_key"):
        L.SequentialLR(optimizer, [first, WD.ConstantWD(optimizer, 0.1)], milestones=[5])
    tagged = _optimizer([{"params": [torch.nn.Parameter(torch.zeros(1))], "tags": "a"}])
    with pytest.raises(ValueError, match="param_group_tags"):
        L.SequentialLR(
            tagged,
            [L.ConstantLR(tagged, 0.1), L.ConstantLR(tagged, 0.2)],
            milestones=[2],
            param_group_tags="a",
        )

    sequential = L.SequentialLR(optimizer, [first, second], milestones=np.array([5]))
    assert first not in optimizer._schedulers_registry
    assert sequential in optimizer._schedulers_registry
    values = []
    for _ in range(8):
        values.append(sequential.get_last_lr()[0].item())
        optimizer.step()
        sequential.step()
    assert values == pytest.approx([0.1] * 5 + [1.0, 0.75, 0.5])
    assert second.last_epoch.item() == 3 and first.last_epoch.item() == 8
    state = sequential.state_dict()
    assert [s["last_epoch"].item() for s in state["_schedulers"]] == [8, 3]
    assert state["_milestones"] == [5]


def test_cosine_annealing_warm_restarts_restarts_every_period(cpu_backend):
    optimizer = _optimizer()
    scheduler = L.CosineAnnealingWarmRestarts(optimizer, 1.0, T_0=4)
    values = []
    for _ in range(14):
        values.append(scheduler.get_last_lr()[0].item())
        optimizer.step()
        scheduler.step()
    want = [(1 + math.cos(math.pi * (t % 4) / 4)) / 2 for t in range(14)]
    assert values == pytest.approx(want, abs=1e-6)
    # the reference's values (constant after the first period) are not reproduced
    buggy = [1, 0.854, 0.5, 0.146, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1]
    assert values[:4] == pytest.approx(buggy[:4], abs=1e-3)
    assert values[5] == pytest.approx(0.854, abs=1e-3) and values[5] != pytest.approx(1.0)
    with pytest.raises(ValueError, match="T_mult=2"):
        L.CosineAnnealingWarmRestarts(optimizer, 1.0, T_0=4, T_mult=2)
    doc = " ".join(L.CosineAnnealingWarmRestarts.__doc__.split())
    assert "Differs from cerebras-pytorch 2.10 after the first period" in doc


def test_polynomial_cycle_restarts(cpu_backend):
    optimizer = _optimizer()
    cyclic = L.PolynomialLR(optimizer, 0.1, 0.01, total_iters=8, cycle=True)
    plain = L.PolynomialLR(_optimizer(), 0.1, 0.01, total_iters=8)
    for _ in range(9):
        optimizer.step()
        cyclic.step()
        plain.optimizer.step()
        plain.step()
    # t = 9: the decay restarted over a 16-step horizon (the reference ignored cycle)
    assert cyclic.get_last_lr()[0].item() == pytest.approx(0.09 * (1 - 9 / 16) + 0.01)
    assert plain.get_last_lr()[0].item() == pytest.approx(0.01)
    assert "Differs from cerebras-pytorch" in " ".join(L.PolynomialLR.__doc__.split())


@pytest.mark.slow
def test_lambda_schedulers(cpu_backend):
    optimizer = _optimizer()
    default = L.LambdaLR(optimizer, 0.5)
    for _ in range(3):
        optimizer.step()
        default.step()
    # initial applied once (the reference gives initial**2 * (t/30) * 0.95**t)
    assert default.get_last_lr()[0].item() == pytest.approx(0.5 * 3 / 30 * 0.95**3)
    assert float(default.schedule_fn(3)) == pytest.approx(0.5 * 3 / 30 * 0.95**3)

    class Halving(L.LambdaLR):
        def set_value_lambda(self):
            return [lambda epoch: torch.pow(0.5, epoch)]

    torch_form = Halving(_optimizer(), 2.0)
    step = cstorch.trace(lambda: (torch_form.optimizer.step(), torch_form.step()))
    for _ in range(3):
        step()
    assert torch_form.get_last_lr()[0].item() == pytest.approx(2.0 * 0.5**3)
    with pytest.raises(NotImplementedError, match="torch ops"):
        torch_form.schedule_fn

    jax_backend_schedules = pytest.importorskip("jax_backend.schedules")
    jax_backend_schedules.register_lambda("test_thirds", lambda c: 1.0 / (1.0 + c))

    class Named(L.LambdaLR):
        def set_value_lambda(self):
            return ["test_thirds"]

    named = Named(_optimizer(), 3.0)
    named.optimizer.step()
    named.step()
    assert named.get_last_lr()[0].item() == pytest.approx(1.5)
    assert float(named.schedule_fn(2)) == pytest.approx(1.0)


def test_chained_shares_last_epoch_and_needs_no_optimizer(cpu_backend):
    optimizer = _optimizer()
    step_lr = L.StepLR(optimizer, 1.0, step_size=2, gamma=0.5)
    cosine = L.CosineAnnealingLR(optimizer, 2.0, T_max=5)
    chain = L.ChainedScheduler([step_lr, cosine])
    assert chain.optimizer is optimizer
    assert step_lr.last_epoch is chain.last_epoch is cosine.last_epoch
    for t in range(1, 6):
        optimizer.step()
        chain.step()
        want = 0.5 ** (t // 2) * (1 + math.cos(math.pi * t / 5)) / 2
        assert chain.get_last_lr()[0].item() == pytest.approx(want, abs=1e-6)
    assert step_lr.last_epoch.item() == 5
    assert len(chain.state_dict()["_schedulers"]) == 2
    with pytest.raises(ValueError, match="same optimizer"):
        L.ChainedLR([L.ConstantLR(_optimizer(), 0.1), L.StepLR(_optimizer(), 1.0, 2, 0.5)])
    with pytest.raises(TypeError, match="initial_val"):
        L.ChainedLR([L.StepLR(optimizer, 1.0, 2, 0.5), L.ConstantLR(optimizer, 0.1)])
    assert L.ChainedScheduler is not S.ChainedScheduler
    assert issubclass(L.ChainedScheduler, L.ChainedLR)


def test_scale_per_param(cpu_backend):
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    optimizer = _optimizer([{"params": [a], "adjust_learning_rate": 0.5}, {"params": [b]}])
    inner = L.LinearLR(optimizer, 1.0, 0.0, total_iters=4)
    scaled = L.ScalePerParamLR(optimizer, inner)
    assert inner not in optimizer._schedulers_registry
    step = cstorch.trace(lambda: (optimizer.step(), scaled.step()))
    step()
    assert [v.item() for v in scaled.get_last_lr()] == pytest.approx([0.375, 0.75])
    state = scaled.state_dict()
    assert state["lr_adjustment_scalars"] == [0.5, 1.0]
    assert "_scheduler_nested" not in state and state["_scheduler"]["last_epoch"].item() == 1
    assert "_get_called_within_step" not in state["_scheduler"]
    with pytest.raises(ValueError, match="param_group_tags"):
        L.ScalePerParamLR(optimizer, L.ConstantLR(optimizer, 0.1), param_group_tags=[None])
    wd_optimizer = _optimizer([{"params": [a], "adjust_val": 2.0}], weight_decay=0.1)
    wd = WD.ScalePerParamWD(wd_optimizer, WD.ConstantWD(wd_optimizer, 0.1))
    assert wd.get_last_value()[0].item() == pytest.approx(0.2)
    assert wd_optimizer.param_groups[0]["weight_decay"].item() == pytest.approx(0.2)


def test_weight_decay_schedulers(cpu_backend):
    optimizer = _optimizer(weight_decay=0.0)
    piecewise = WD.PiecewiseConstantWD(optimizer, vals=[0.1, 0.01], milestones=[2])
    assert optimizer.param_groups[0]["lr"] == 1.0  # the lr is not scheduled
    values = []
    for _ in range(4):
        values.append(piecewise.get_last_value()[0].item())
        optimizer.step()
        piecewise.step()
    assert values == pytest.approx([0.1, 0.1, 0.01, 0.01])
    cyclic = WD.CyclicWD(_optimizer(), base_val=0.0, max_val=1.0, step_size_up=2)
    assert "base_val" in cyclic.state_dict() and cyclic.scale_mode == "cycle"
    with pytest.raises(ValueError, match="len\\(milestones\\) \\+ 1"):
        WD.PiecewiseConstantWD(_optimizer(), vals=[0.1, 0.2, 0.3, 0.4], milestones=[2])


# ------------------------------------------------------------------ every class
LR_ARGS = {
    "ConstantLR": (0.1,),
    "PolynomialLR": (1.0, 0.0, 10),
    "LinearLR": (1.0, 0.0, 10),
    "ExponentialLR": (1.0, 10, 0.5),
    "InverseExponentialTimeDecayLR": (1.0, 1, 10, 0.5),
    "InverseSquareRootDecayLR": (),
    "CosineDecayLR": (1.0, 0.0, 10),
    "PiecewiseConstantLR": ([0.1, 0.01], [3]),
    "MultiStepLR": (1.0, 0.5, [2, 4]),
    "StepLR": (1.0, 2, 0.5),
    "CosineAnnealingLR": (1.0, 5),
    "LambdaLR": (1.0,),
    "CosineAnnealingWarmRestarts": (1.0, 3),
    "MultiplicativeLR": (1.0, 0.9),
    "CyclicLR": (0.1, 1.0),
    "OneCycleLR": (0.1, 1.0),
}


def test_module_exports():
    assert S.__all__[0] == "Scheduler"
    assert set(S.__all__) == {
        name
        for name, value in vars(S).items()
        if isinstance(value, type)
        and issubclass(value, S.Scheduler)
        and value.__module__ == S.__name__
        and not name.startswith("_")
    }
    assert len(S.__all__) == 20
    for name in L.__all__:
        assert issubclass(getattr(L, name), L.LRScheduler)
    for name in WD.__all__:
        assert issubclass(getattr(WD, name), WD.WeightDecayScheduler)
    assert {n[:-2] for n in WD.__all__ if n.endswith("WD")} >= {
        n[:-2] for n in L.__all__ if n.endswith("LR") and n not in ("LRScheduler",)
    } - {"Chained"}


@pytest.mark.parametrize("name", sorted(LR_ARGS))
def test_every_lr_class_has_a_schedule_fn_matching_its_values(name, cpu_backend):
    optimizer = _optimizer()
    scheduler = getattr(L, name)(optimizer, *LR_ARGS[name])
    fn = scheduler.schedule_fn
    for t in range(6):
        assert scheduler.get_last_lr()[0].item() == pytest.approx(float(fn(t)), abs=1e-7)
        optimizer.step()
        scheduler.step()
    assert scheduler.__doc__, name


def test_user_closed_forms_inside_composites(cpu_backend):
    """A child whose value is user torch code keeps it inside sequential, chained and
    scale-per-param schedulers (traced), and has no JAX ``schedule_fn``."""

    class SquaredLinearLR(L.LinearLR):
        def _get_closed_form(self):
            return super()._get_closed_form() ** 2

    class OldStyleLR(L.LRScheduler):  # the older hook name
        def __init__(self, optimizer):
            super().__init__(optimizer, total_iters=None)

        def _get_closed_form_lr(self):
            return torch.tensor(0.5) / (self.last_epoch + 1)

    optimizer = _optimizer()
    squared = SquaredLinearLR(optimizer, 1.0, 0.0, total_iters=4)
    with pytest.raises(NotImplementedError):
        squared.schedule_fn
    sequential = L.SequentialLR(optimizer, [squared, OldStyleLR(optimizer)], milestones=[2])
    scaled = L.ScalePerParamLR(optimizer, sequential)
    step = cstorch.trace(lambda: (optimizer.step(), scaled.step()))
    values = [scaled.get_last_lr()[0].item()]
    for _ in range(4):
        step()
        values.append(scaled.get_last_lr()[0].item())
    assert values == pytest.approx([1.0, 0.5625, 0.5, 0.25, 0.5 / 3])

    chain = L.ChainedLR([L.StepLR(_optimizer(), 1.0, 1, 0.5)])
    chain_user = L.ChainedLR([OldStyleLR(chain.optimizer)])
    assert chain.schedule_fn(2) == pytest.approx(0.25)
    assert chain_user.get_last_lr()[0].item() == pytest.approx(0.5)


def test_scheduled_values_stay_tensors_when_loading_plain_numbers(cpu_backend):
    model = torch.nn.Linear(2, 1)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = L.StepLR(optimizer, 1.0, step_size=1, gamma=0.5)
    optimizer.load_state_dict(torch.optim.SGD(model.parameters(), lr=0.3).state_dict())
    lr = optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.item() == pytest.approx(0.3)
    step = cstorch.trace(lambda: (optimizer.step(), scheduler.step()))
    step()
    step()
    assert scheduler.get_last_lr()[0].item() == 0.25

    optimizer.param_groups[0]["lr"] = 0.5  # a plain number cannot be updated by a traced step
    with pytest.raises(RuntimeError, match="holds 0.5 instead of a float32 0-dim tensor"):
        cstorch.trace(lambda: (optimizer.step(), scheduler.step()))()


@pytest.mark.slow
def test_eager_steps_after_traced_steps_start_from_the_newest_state(cpu_backend):
    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model, cpu_backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = L.StepLR(optimizer, 1.0, step_size=1, gamma=0.5)

    def step(x):
        compiled(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()

    traced = cstorch.trace(step)
    x = torch.ones(3, 2)
    for _ in range(3):
        traced(x)
    step(x)  # eagerly
    traced(x)
    assert scheduler.get_last_lr()[0].item() == 0.5**5
    assert scheduler.last_epoch.item() == 5


def test_a_schedule_changed_between_eager_steps_gives_its_new_values():
    """The eager engine evaluates a schedule outside any compiled step, one jitted program
    per schedule description: an argument changed between steps gives the new schedule's
    value at once, and changed back, the first's again (no program of another description
    serves it)."""
    backend = cstorch.backend("CPU", engine="eager")
    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = L.LinearLR(
        optimizer, initial_learning_rate=1.0, end_learning_rate=0.0, total_iters=10
    )
    training_step, seen = lr_recording_step(compiled, optimizer, scheduler)
    expected = []
    for end_val in (0.0, 0.5, 0.0, 0.5):
        scheduler.end_learning_rate = end_val
        training_step(torch.ones(1, 2))
        k = len(seen)  # the count after this step
        expected.append(1.0 + (end_val - 1.0) * k / 10)
    np.testing.assert_allclose(seen, expected, rtol=1e-6)  # 0.9, 0.9, 0.7, 0.8
