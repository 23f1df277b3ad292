"""A torch optimizer's hyperparameters in a compiled step behave as in eager torch, with one
program: a float learning rate set by hand every step, torch's LR schedulers stepped between
steps or inside the step, optimizer edits mid-run (a param group added, a layer frozen or
unfrozen, ``load_state_dict``).

Each case runs the same script eagerly (plain torch, the reference) and as a compiled step,
and compares the losses and parameters at every step (fp32, 1e-5), the learning rates and
the scheduler's state; where the program does not change, no second program is compiled
(warnings are errors) and CSX, which cannot recompile, runs it too.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.core.compile import RecompilationWarning
from jax_backend.errors import CaptureError, RecompilationError, ValueReadInTraceError
from tests.cstorch.core.test_torch_optimizers import OPTIMIZERS, XS, YS, _backend, _loss, _model
from tests.lanes import marked_cases

# As tests/cstorch/core/test_torch_optimizers.py: torch's capturable path (a compiled step's)
# computes Adam's bias corrections in float32 where eager torch uses Python floats.
TOL = dict(rtol=1e-5, atol=1e-5)
STEPS = 6


def _train(
    engine, make_optimizer, *, setup=None, between=None, in_step=None, set_to_none=True, steps=STEPS
):
    """The same script eagerly (``engine="eager"``) or compiled (``"CPU"``, ``"CSX"``):
    ``setup(run)`` after the optimizer is built (``run``: a dict of the script's objects),
    ``between(run, i)`` before step ``i``, ``in_step(run)`` at the end of the step body.
    Returns ``run`` with its ``losses``, ``lrs`` (the first group's lr after each step) and
    ``step``."""
    model = _model()
    forward = model
    if engine != "eager":
        forward = cstorch.compile(model, _backend(engine))
    optimizer = make_optimizer(model.parameters())
    run = {"model": model, "optimizer": optimizer, "losses": [], "lrs": []}
    if setup is not None:
        setup(run)

    def body(x, y):
        optimizer.zero_grad(set_to_none=set_to_none)
        loss = _loss(forward(x), y)
        loss.backward()
        optimizer.step()
        if in_step is not None:
            in_step(run)
        return loss

    step = body if engine == "eager" else cstorch.trace(body)
    run["step"] = step
    for i in range(steps):
        if between is not None:
            between(run, i)
        run["losses"].append(float(step(XS[i], YS[i])))
        run["lrs"].append(optimizer.param_groups[0]["lr"])
    return run


def _assert_like_eager(engine, make_optimizer, **script):
    """Runs the script both ways (no recompilation allowed) and compares them; returns the
    compiled run and the eager one."""
    eager = _train("eager", make_optimizer, **script)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompilationWarning)
        ours = _train(engine, make_optimizer, **script)
    torch.testing.assert_close(ours["losses"], eager["losses"], **TOL)
    for mine, theirs in zip(ours["model"].parameters(), eager["model"].parameters()):
        torch.testing.assert_close(mine.detach(), theirs.detach(), **TOL)
    assert ours["lrs"] == pytest.approx(eager["lrs"], rel=1e-12)
    assert len(ours["step"].programs) == 1
    return ours, eager


def _per_step_lr(run, i):
    """nanoGPT's pattern: a Python float from a schedule function, set on every group."""
    for group in run["optimizer"].param_groups:
        group["lr"] = 0.05 * (i + 1) / STEPS if i < 3 else 0.05 * 0.5 ** (i - 2)


# ------------------------------------------------------------- a float lr set every step
@pytest.mark.parametrize(
    "name",
    marked_cases(
        OPTIMIZERS,
        list(OPTIMIZERS),
        slow=[n for n in OPTIMIZERS if n not in ("SGD-momentum", "AdamW")],
    ),
)
def test_a_float_lr_set_every_step_needs_one_program(name):
    _assert_like_eager("CPU", OPTIMIZERS[name], between=_per_step_lr)


@pytest.mark.parametrize("name", ["SGD-momentum", "AdamW", "Adadelta"])
def test_a_float_lr_set_every_step_runs_on_csx(name):
    _assert_like_eager("CSX", OPTIMIZERS[name], between=_per_step_lr)


def test_a_float_weight_decay_and_betas_set_every_step_need_one_program():
    def change(run, i):
        group = run["optimizer"].param_groups[0]
        group["weight_decay"] = 0.01 * (i + 1)
        group["betas"] = (0.9 - 0.05 * i, 0.999)

    _assert_like_eager("CPU", lambda p: torch.optim.AdamW(p, lr=0.05), between=change)


# ----------------------------------------------------------------- torch's LR schedulers
SCHEDULERS = {
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(
        o, max_lr=0.1, total_steps=STEPS + 1
    ),
    "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4),
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda t: 1 / (1 + t)),
    "SequentialLR": lambda o: torch.optim.lr_scheduler.SequentialLR(
        o,
        [
            torch.optim.lr_scheduler.LinearLR(o, 0.1, total_iters=2),
            torch.optim.lr_scheduler.ExponentialLR(o, 0.8),
        ],
        milestones=[2],
    ),
}
# OneCycleLR cycles SGD's momentum and Adam's betas too.
SCHEDULED = {"SGD-momentum": OPTIMIZERS["SGD-momentum"], "Adam": OPTIMIZERS["Adam"]}


def _with_scheduler(kind):
    def setup(run):
        run["scheduler"] = SCHEDULERS[kind](run["optimizer"])

    return setup


def _step_scheduler(run, i=None):
    if i is None or i > 0:
        run["scheduler"].step()


@pytest.mark.parametrize(
    "kind", marked_cases(SCHEDULERS, list(SCHEDULERS), slow=["CosineAnnealingLR", "SequentialLR"])
)
@pytest.mark.parametrize("optimizer", list(SCHEDULED))
def test_a_torch_scheduler_stepped_between_steps_needs_one_program(kind, optimizer):
    _assert_like_eager(
        "CPU", SCHEDULED[optimizer], setup=_with_scheduler(kind), between=_step_scheduler
    )


def _assert_scheduler_like_eager(ours, eager):
    mine, theirs = ours["scheduler"], eager["scheduler"]
    assert mine.last_epoch == theirs.last_epoch == STEPS
    assert mine.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12)
    state, expected = mine.state_dict(), theirs.state_dict()
    for key in ("last_epoch", "_step_count", "_last_lr", "base_lrs"):
        if key in expected:
            assert state[key] == pytest.approx(expected[key], rel=1e-12), key


@pytest.mark.parametrize(
    "kind", marked_cases(SCHEDULERS, list(SCHEDULERS), slow=["CosineAnnealingLR", "LambdaLR"])
)
@pytest.mark.parametrize("optimizer", list(SCHEDULED))
def test_a_torch_scheduler_stepped_in_the_step_runs_after_each_call(kind, optimizer):
    """``scheduler.step()`` in the traced step runs on the host after every call (it would
    run only while the step is traced), so lr, ``last_epoch`` and ``state_dict()`` follow
    eager torch's."""
    ours, eager = _assert_like_eager(
        "CPU", SCHEDULED[optimizer], setup=_with_scheduler(kind), in_step=_step_scheduler
    )
    _assert_scheduler_like_eager(ours, eager)


@pytest.mark.parametrize("engine", ["CPU", "CSX"])
def test_a_scheduler_in_the_step_keeps_its_place_before_the_optimizer_step(engine):
    """Stepped before the optimizer in the body (eager torch warns about the order), the
    scheduler's new lr is the one this very step uses."""
    make = OPTIMIZERS["SGD-momentum"]

    def build(engine_kind):
        model = _model()
        forward = model if engine_kind == "eager" else cstorch.compile(model, _backend(engine_kind))
        optimizer = make(model.parameters())
        scheduler = SCHEDULERS["StepLR"](optimizer)

        def body(x, y):
            optimizer.zero_grad()
            loss = _loss(forward(x), y)
            loss.backward()
            scheduler.step()
            optimizer.step()
            return loss

        step = body if engine_kind == "eager" else cstorch.trace(body)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch: "lr_scheduler.step() before"
            losses = [float(step(XS[i], YS[i])) for i in range(STEPS)]
        return losses, model, scheduler

    expected, eager_model, eager_scheduler = build("eager")
    losses, model, scheduler = build(engine)
    torch.testing.assert_close(losses, expected, **TOL)
    assert scheduler.last_epoch == eager_scheduler.last_epoch == STEPS
    for mine, theirs in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(mine.detach(), theirs.detach(), **TOL)


def test_a_scheduler_in_the_step_runs_on_csx():
    ours, eager = _assert_like_eager(
        "CSX", OPTIMIZERS["Adam"], setup=_with_scheduler("OneCycleLR"), in_step=_step_scheduler
    )
    _assert_scheduler_like_eager(ours, eager)


def test_reduce_lr_on_plateau_in_the_step_names_the_line():
    def setup(run):
        run["scheduler"] = torch.optim.lr_scheduler.ReduceLROnPlateau(run["optimizer"])

    def in_step(run):
        run["scheduler"].step(run["optimizer"].param_groups[0]["params"][0].sum())

    with pytest.raises(ValueReadInTraceError, match="test_torch_hyperparameters.py"):
        _train("CPU", OPTIMIZERS["SGD"], setup=setup, in_step=in_step, steps=1)


# ------------------------------------------------------------ what still selects a program
@pytest.mark.parametrize("engine", ["CPU", "CSX"])
def test_a_weight_decay_set_to_zero_selects_another_program(engine):
    """torch's step skips the weight decay term when it is 0 (``if weight_decay != 0``): a
    zero that appears mid-run changes the program (CSX refuses, naming it); other values do
    not."""

    def change(run, i):
        run["optimizer"].param_groups[0]["weight_decay"] = [0.01, 0.02, 0.03, 0.0][min(i, 3)]

    make = OPTIMIZERS["SGD-momentum"]
    eager = _train("eager", make, between=change)
    if engine == "CSX":
        with pytest.raises(RecompilationError, match=r"optimizer0\.group\.0\.weight_decay"):
            _train(engine, make, between=change)
        return
    with pytest.warns(RecompilationWarning, match=r"sign of optimizer0\.group\.0\.weight_decay"):
        ours = _train(engine, make, between=change)
    torch.testing.assert_close(ours["losses"], eager["losses"], **TOL)
    assert len(ours["step"].programs) == 2


def test_setting_a_hyperparameter_in_the_step_is_refused():
    def in_step(run):
        run["optimizer"].param_groups[0]["lr"] *= 0.9  # in eager torch: every step

    with pytest.raises(CaptureError, match=r"sets 'optimizer0\.group\.0\.lr' in Python"):
        _train("CPU", OPTIMIZERS["SGD"], in_step=in_step, steps=1)


def test_an_eval_step_never_recompiles_for_an_optimizer():
    model = _model()
    compiled = cstorch.compile(model, _backend("CPU"))
    optimizers = [
        torch.optim.SGD(model.parameters(), lr=0.1),
        cstorch.optim.SGD(model.parameters(), lr=0.1),
    ]

    @cstorch.trace
    @torch.no_grad()
    def evaluate(x, y):
        return _loss(compiled(x), y)

    expected = [_loss(model(x), y).item() for x, y in zip(XS, YS)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompilationWarning)
        for i, (x, y) in enumerate(zip(XS, YS)):
            for optimizer in optimizers:
                optimizer.param_groups[0]["lr"] = 0.1 / (i + 1)
                optimizer.param_groups[0]["momentum"] = 0.5 if i % 2 else 0.0
            assert evaluate(x, y).item() == pytest.approx(expected[i], rel=1e-6)
    assert evaluate.trace_count == 1


def test_the_lr_read_in_the_step_is_the_current_one():
    seen = []

    @cstorch.step_closure
    def record(lr, twice):
        seen.append((lr, twice))

    def in_step(run):
        lr = run["optimizer"].param_groups[0]["lr"]
        record(lr, lr * 2)

    run = _train("CPU", OPTIMIZERS["SGD"], between=_per_step_lr, in_step=in_step)
    assert [lr for lr, _ in seen] == run["lrs"]
    assert all(type(lr) is float and twice == 2 * lr for lr, twice in seen)


def test_a_number_from_a_hyperparameter_kept_on_a_module_is_refused():
    """Eager torch would keep the float; in the compiled step it is the program's input, with
    no value after the trace: refused, naming where it was kept, and nothing of it stays."""

    def in_step(run):
        run["model"].last_lr = run["optimizer"].param_groups[0]["lr"] * 2

    model = None
    with pytest.raises(
        CaptureError,
        match=r"number computed from an optimizer's "
        r"hyperparameter .* in model0\.last_lr: .* Read the hyperparameter "
        r"outside the step",
    ):

        def setup(run):
            nonlocal model
            model = run["model"]

        _train(
            "CPU", OPTIMIZERS["SGD"], between=_per_step_lr, in_step=in_step, setup=setup, steps=1
        )
    assert not hasattr(model, "last_lr")


# --------------------------------------------------------------------- optimizer edits
@pytest.mark.parametrize("name", ["SGD-momentum", "Adam"])
def test_a_param_group_added_mid_run_is_stepped_as_in_eager(name):
    """The added group's parameters get their optimizer state in their first step (state
    born mid-run), the existing state is kept."""

    def setup(run):
        optimizer = run["optimizer"]
        del optimizer.param_groups[1:]
        optimizer.param_groups[0]["params"] = list(run["model"][0].parameters())
        optimizer.state.clear()

    def add(run, i):
        if i == 3:
            run["optimizer"].add_param_group(
                {"params": list(run["model"][2].parameters()), "lr": 0.01}
            )

    make = OPTIMIZERS[name]
    eager = _train("eager", make, setup=setup, between=add)
    with pytest.warns(RecompilationWarning, match="param groups"):
        ours = _train("CPU", make, setup=setup, between=add)
    torch.testing.assert_close(ours["losses"], eager["losses"], **TOL)
    for mine, theirs in zip(ours["model"].parameters(), eager["model"].parameters()):
        torch.testing.assert_close(mine.detach(), theirs.detach(), **TOL)
    _assert_optimizer_state_like(ours["optimizer"], eager["optimizer"])


def _assert_optimizer_state_like(mine, theirs):
    state, expected = mine.state_dict(), theirs.state_dict()
    assert state["state"].keys() == expected["state"].keys()
    for index, values in expected["state"].items():
        for key, value in values.items():
            torch.testing.assert_close(state["state"][index][key], value, **TOL)


@pytest.mark.parametrize("set_to_none", [False, True])
@pytest.mark.parametrize("name", ["SGD-momentum", "Adam"])
def test_a_layer_frozen_mid_run_is_stepped_as_in_eager(name, set_to_none):
    """Frozen after zero_grad(set_to_none=False), a parameter keeps its zero gradient in eager
    torch, so momentum and weight decay keep moving it; with set_to_none it stops."""

    def freeze(run, i):
        if i == 3:
            run["model"][0].weight.requires_grad_(False)

    make = OPTIMIZERS[name]
    eager = _train("eager", make, between=freeze, set_to_none=set_to_none)
    with pytest.warns(RecompilationWarning, match="requires_grad"):
        ours = _train("CPU", make, between=freeze, set_to_none=set_to_none)
    torch.testing.assert_close(ours["losses"], eager["losses"], **TOL)
    for mine, theirs in zip(ours["model"].parameters(), eager["model"].parameters()):
        torch.testing.assert_close(mine.detach(), theirs.detach(), **TOL)
    assert len(ours["step"].programs) == 2


@pytest.mark.parametrize("set_to_none", [False, True])
def test_a_layer_unfrozen_mid_run_is_stepped_as_in_eager(set_to_none):
    def setup(run):
        run["model"][0].weight.requires_grad_(False)

    def unfreeze(run, i):
        if i == 3:
            run["model"][0].weight.requires_grad_(True)

    make = OPTIMIZERS["SGD-momentum"]
    eager = _train("eager", make, setup=setup, between=unfreeze, set_to_none=set_to_none)
    with pytest.warns(RecompilationWarning, match="requires_grad"):
        ours = _train("CPU", make, setup=setup, between=unfreeze, set_to_none=set_to_none)
    torch.testing.assert_close(ours["losses"], eager["losses"], **TOL)
    for mine, theirs in zip(ours["model"].parameters(), eager["model"].parameters()):
        torch.testing.assert_close(mine.detach(), theirs.detach(), **TOL)


@pytest.mark.parametrize("name", ["SGD-momentum", "AdamW"])
def test_optimizer_load_state_dict_mid_run_is_as_in_eager(name):
    """Going back to an earlier optimizer state (its moments and lr) mid-run."""

    def between(run, i):
        if i == 2:
            run["saved"] = run["optimizer"].state_dict()
            run["saved"] = {
                "state": {
                    k: {n: v.clone() for n, v in s.items()}
                    for k, s in run["saved"]["state"].items()
                },
                "param_groups": [dict(g) for g in run["saved"]["param_groups"]],
            }
        if i == 4:
            run["optimizer"].load_state_dict(run["saved"])

    ours, eager = _assert_like_eager("CPU", OPTIMIZERS[name], between=between)
    _assert_optimizer_state_like(ours["optimizer"], eager["optimizer"])
