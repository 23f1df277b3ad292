"""Mixed precision: the half-dtype policy, the lowered program's dtypes, bf16/fp16 training
and dynamic loss scaling inside the compiled step (issue 5)."""

import copy

import jax
import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from tests.jit_cache import xla_compilations
from tests.models import TinyGPT, lm_loss


def test_half_dtype_policy():
    assert cstorch.amp.get_half_dtype() == torch.float16
    assert cstorch.amp.get_half_dtype_str() == "float16"
    assert not cstorch.amp.mixed_precision()
    assert cstorch.amp.get_floating_point_dtype() == torch.float32
    assert cstorch.amp.set_half_dtype("bfloat16") == torch.bfloat16
    assert cstorch.amp.mixed_precision()
    assert cstorch.amp.get_floating_point_dtype_str() == "bfloat16"
    assert cstorch.amp.set_half_dtype("cbfloat16") == torch.float16
    assert cstorch.amp.is_cbfloat16_tensor(torch.zeros(1, dtype=torch.float16))
    with pytest.raises(ValueError):
        cstorch.amp.set_half_dtype(torch.float32)
    with pytest.raises(ValueError):
        cstorch.amp.enable_mixed_precision("yes")


def test_autocast_rules():
    with pytest.raises(RuntimeError, match="No active Cerebras backend"):
        with cstorch.amp.autocast():
            pass
    cstorch.backend("CPU")
    with pytest.raises(ValueError, match="bfloat16"):
        with cstorch.amp.autocast():
            pass
    with cstorch.amp.autocast(torch.bfloat16):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_grad_scaler_and_optimizer_step_validation():
    backend = cstorch.backend("CPU")
    model = torch.nn.Linear(2, 2)
    cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="min_loss_scale"):
        cstorch.amp.GradScaler(loss_scale="dynamic", min_loss_scale=1e-6)
    scaler = cstorch.amp.GradScaler()
    with pytest.raises(ValueError, match="new_scale"):
        scaler.update(new_scale=2.0)
    assert scaler.state_dict() == {"loss_scale": 1.0}
    assert int(scaler.get_num_skipped_steps()) == 0
    loss = model(torch.ones(1, 2)).sum()
    with pytest.raises(ValueError, match="not both"):
        cstorch.amp.optimizer_step(
            loss, optimizer, scaler, max_gradient_norm=1.0, max_gradient_value=1.0
        )
    with pytest.raises(ValueError, match="non-negative"):
        cstorch.amp.optimizer_step(loss, optimizer, scaler, max_gradient_norm=-1)
    with pytest.raises(TypeError, match="GradScaler"):
        cstorch.amp.optimizer_step(loss, optimizer, object())
    with pytest.raises(TypeError, match="optimizer 1"):
        cstorch.amp.optimizer_step(loss, [optimizer, object()], scaler)
    with pytest.raises(ValueError, match="single tensor"):
        cstorch.amp.optimizer_step(1.0, optimizer, scaler)


def _all_equations(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                yield from _all_equations(inner)


@pytest.mark.slow
def test_lowered_bf16_step_has_bf16_dots_and_an_fp32_update():
    cstorch.amp.set_half_dtype("bfloat16")
    backend = cstorch.backend("CPU")
    model = TinyGPT(vocab=64, d=32, heads=2, layers=1, seq=8)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3)

    @cstorch.trace
    def step(x, y):
        loss = lm_loss(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    tokens = torch.randint(0, 64, (2, 9))
    step(tokens[:, :-1], tokens[:, 1:])
    closed = step.jaxpr()
    dots = [e for e in _all_equations(closed.jaxpr) if e.primitive.name == "dot_general"]
    half_dots = [e for e in dots if all(v.aval.dtype == jax.numpy.bfloat16 for v in e.invars)]
    # 4 Linear layers + the tied head, forward and two backward products each.
    assert len(half_dots) >= 15, [tuple(v.aval.dtype for v in e.invars) for e in dots]
    assert all(e.params["preferred_element_type"] == np.float32 for e in half_dots)

    # Every updated parameter and optimizer-state value is produced in fp32 from fp32 operands.
    producers = {}
    for eqn in closed.jaxpr.eqns:
        for out in eqn.outvars:
            producers[out] = eqn
    written = step.programs[0].captured.written_state
    new_state = closed.jaxpr.outvars[: len(written)]
    assert len(new_state) >= 3 * len(list(model.parameters()))
    for var in new_state:
        assert var.aval.dtype == np.float32
        eqn = producers.get(var)
        if eqn is not None and eqn.primitive.name in ("add", "sub", "mul"):
            assert all(v.aval.dtype == np.float32 for v in eqn.invars if hasattr(v, "aval"))


def _gpt_losses(precision, steps=50, dynamic_scaling=False, overflow_at=None):
    cstorch.backend._reset_for_tests()
    if precision != "float32":
        cstorch.amp.set_half_dtype(precision)
    else:
        cstorch.amp.enable_mixed_precision(False)
    backend = cstorch.backend("CPU")
    torch.manual_seed(0)
    model = TinyGPT()
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic" if dynamic_scaling else None)
    losses, scales, skipped = [], [], []

    @cstorch.step_closure
    def record(loss, scale, num_skipped):
        losses.append(loss.item())
        scales.append(float(scale))
        skipped.append(int(num_skipped))

    @cstorch.trace
    def step(x, y, multiplier):
        loss = lm_loss(compiled(x), y)
        cstorch.amp.optimizer_step(loss * multiplier, optimizer, scaler)
        record(loss, scaler.get_scale(), scaler.get_num_skipped_steps())
        return loss

    g = torch.Generator().manual_seed(1)
    snapshots = {}
    batches = []
    for i in range(steps):
        tokens = (torch.randint(0, 128, (8, 1), generator=g) + torch.arange(33)) % 128
        multiplier = torch.tensor(1e38 if i == overflow_at else 1.0)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), multiplier))
    executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(lambda: batches))
    for i, (x, y, multiplier) in enumerate(executor):
        if overflow_at is not None and i in (overflow_at, overflow_at + 1):
            snapshots[i] = (
                copy.deepcopy(model.state_dict()),
                copy.deepcopy(optimizer.state_dict()["state"]),
            )
        step(x, y, multiplier)
    assert step.trace_count == 1 and xla_compilations(step) == 1
    return losses, scales, skipped, snapshots


@pytest.mark.parametrize("precision,dynamic", [("bfloat16", False), ("float16", True)])
@pytest.mark.slow
def test_half_precision_gpt_ends_within_two_percent_of_fp32(precision, dynamic):
    reference, *_ = _gpt_losses("float32")
    losses, scales, skipped, _ = _gpt_losses(precision, dynamic_scaling=dynamic)
    final, expected = np.mean(losses[-5:]), np.mean(reference[-5:])
    assert expected < 0.5 * reference[0]  # it learned
    assert abs(final - expected) <= 0.02 * expected, (final, expected)
    if dynamic:
        assert skipped[-1] == 0 and scales[-1] == 2.0**15


@pytest.mark.slow
def test_cbfloat16_trains_from_the_reference_initial_loss_scale():
    """cbfloat16 with dynamic loss scaling starts at the reference's scale for it, 2**31,
    which its 6-bit exponent holds (float16's would overflow every step and skip them all):
    the steps update the weights and track fp32."""
    reference, *_ = _gpt_losses("float32", steps=8)
    losses, scales, skipped, _ = _gpt_losses("cbfloat16", steps=8, dynamic_scaling=True)
    assert scales[0] == 2.0**31 and skipped[-1] == 0
    np.testing.assert_allclose(losses, reference, rtol=1e-3)
    assert losses[-1] < losses[0] - 0.3  # it learned (fp32: 4.87 -> 4.40)


@pytest.mark.slow
def test_overflow_skips_the_update_halves_the_scale_and_recovers():
    steps, overflow_at = 12, 5
    losses, scales, skipped, snapshots = _gpt_losses(
        "float16", steps=steps, dynamic_scaling=True, overflow_at=overflow_at
    )
    before_model, before_opt = snapshots[overflow_at]
    after_model, after_opt = snapshots[overflow_at + 1]
    for name in before_model:
        assert torch.equal(before_model[name], after_model[name]), name
    for index in before_opt:
        for key in before_opt[index]:
            assert torch.equal(before_opt[index][key], after_opt[index][key]), (index, key)
    assert scales[overflow_at - 1] == 2.0**15 and scales[overflow_at] == 2.0**14
    assert skipped[overflow_at - 1] == 0 and skipped[overflow_at] == 1 and skipped[-1] == 1
    assert all(np.isfinite(losses[overflow_at + 1 :]))
    assert losses[-1] < losses[overflow_at + 1]


@pytest.mark.slow
def test_schedulers_do_not_advance_on_skipped_steps():
    cstorch.amp.set_half_dtype("bfloat16")  # wide range: only the injected step overflows
    backend = cstorch.backend("CPU")
    model = torch.nn.Linear(4, 1)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    warmup = cstorch.optim.lr_scheduler.LinearLR(
        optimizer, initial_learning_rate=0.0, end_learning_rate=0.1, total_iters=4
    )
    decay = cstorch.optim.lr_scheduler.ConstantLR(optimizer, learning_rate=0.05)
    scheduler = cstorch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, decay], milestones=[4])
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")
    epochs = []

    @cstorch.step_closure
    def record(epoch):
        epochs.append(int(epoch))

    @cstorch.trace
    def step(x, multiplier):
        loss = compiled(x).sum() * multiplier
        cstorch.amp.optimizer_step(loss, optimizer, scaler)
        scheduler.step()
        record(scheduler.last_epoch)
        return loss

    batches = [(torch.ones(2, 4), torch.tensor(1e38 if i == 2 else 1.0)) for i in range(6)]
    for x, multiplier in cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: batches)
    ):
        step(x, multiplier)
    assert epochs == [1, 2, 2, 3, 4, 5]
    lr = scheduler.get_last_lr()[0].item()
    assert lr == pytest.approx(0.05)  # five counted steps: past the milestone


def test_grad_scaler_with_a_torch_optimizer_trains_as_eager_torch(cpu_backend):
    """The capture that meets a torch optimizer's step for the first time stops there (the
    optimizer is adopted, the step captured again): the scaler's bookkeeping of that
    optimizer, half way through (unscaled), is reset with the others'. The second capture
    used to raise "Optimizer parameter gradients already scaled"."""
    xs = [torch.randn(8, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]

    def model_and_optimizer():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, optimizer = model_and_optimizer()
    expected = []
    for x in xs:  # eager torch, unscaled (a power-of-two scale unscales exactly)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        expected.append(loss.item())

    model, optimizer = model_and_optimizer()
    compiled = cstorch.compile(model, cpu_backend)
    scaler = cstorch.amp.GradScaler(loss_scale=128.0)

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        cstorch.amp.optimizer_step(loss, optimizer, scaler)
        return loss

    losses = [step(x).item() for x in xs]
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
