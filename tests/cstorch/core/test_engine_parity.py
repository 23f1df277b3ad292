"""Unchanged cstorch training scripts vs the same model in eager torch.

Each test runs a script in the style of the Cerebras docs through cstorch (one compiled JAX
program per step) and the same model, seed and data eagerly in torch, and compares the loss
of every step (fp32: relative error < 1e-4 over 30 steps).
"""

import copy

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from tests import eager_reference as ref
from tests.jit_cache import xla_compilations
from tests.models import MLP, SmallCNN, TinyGPT, lm_loss

pytestmark = pytest.mark.core

STEPS = 30
RTOL = 1e-4


def _batches(make, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [make(g) for _ in range(steps)]


def _run_executor(batches, training_step, closure_losses):
    dataloader = cstorch.utils.data.DataLoader(lambda: batches)
    executor = cstorch.utils.data.DataExecutor(dataloader, num_steps=len(batches))
    for inputs, targets in executor:
        training_step(inputs, targets)
    return closure_losses


def _assert_close(losses, expected):
    assert len(losses) == len(expected) == STEPS
    for step, (a, b) in enumerate(zip(losses, expected)):
        assert abs(a - b) <= RTOL * abs(b), f"step {step}: cstorch {a} vs eager {b}"


def _sgd_script(model, batches, lr, momentum, weight_decay):
    """The docs' MNIST-style loop: compile, trace, SGD, step closure for the loss."""
    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(
        model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    losses = []

    @cstorch.step_closure
    def record(loss):
        losses.append(loss.item())

    @cstorch.trace
    def training_step(inputs, targets):
        outputs = compiled(inputs)
        loss = loss_fn(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record(loss)
        return loss

    _run_executor(batches, training_step, losses)
    return losses, training_step


def _sgd_eager(model, batches, lr, momentum, weight_decay):
    optimizer = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
    )
    losses = []
    for inputs, targets in batches:
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


_TEACHER = torch.randn(784, 10, generator=torch.Generator().manual_seed(7))


def _mnist_batch(g):
    """Learnable data: labels of a fixed random linear teacher."""
    x = torch.randn(32, 1, 28, 28, generator=g)
    return x, (x.flatten(1) @ _TEACHER).argmax(1)


@pytest.mark.slow
def test_mnist_mlp_matches_eager_torch():
    model = MLP((784, 128, 64, 10))
    eager_model = copy.deepcopy(model)
    batches = _batches(_mnist_batch, STEPS)
    losses, _ = _sgd_script(model, batches, lr=0.05, momentum=0.9, weight_decay=1e-4)
    expected = _sgd_eager(eager_model, batches, lr=0.05, momentum=0.9, weight_decay=1e-4)
    _assert_close(losses, expected)
    assert expected[-1] < expected[0]


def _image_batch(g):
    x = torch.randn(16, 1, 16, 16, generator=g)
    return x, (x.flatten(1) @ _TEACHER[:256]).argmax(1)


@pytest.mark.slow
def test_cnn_with_batchnorm_matches_eager_torch():
    model = SmallCNN()
    eager_model = copy.deepcopy(model)
    batches = _batches(_image_batch, STEPS)
    losses, _ = _sgd_script(model, batches, lr=0.05, momentum=0.9, weight_decay=0.0)
    expected = _sgd_eager(eager_model, batches, lr=0.05, momentum=0.9, weight_decay=0.0)
    _assert_close(losses, expected)
    # BatchNorm running statistics live on the JAX side and come back through state_dict.
    state, eager_state = model.state_dict(), eager_model.state_dict()
    for name in ("bn1.running_mean", "bn2.running_var", "bn1.num_batches_tracked"):
        torch.testing.assert_close(state[name], eager_state[name], rtol=1e-4, atol=1e-5)
    assert int(state["bn1.num_batches_tracked"]) == STEPS


@pytest.mark.slow
def test_cnn_eval_mode_uses_running_stats():
    model = SmallCNN()
    eager_model = copy.deepcopy(model)
    batches = _batches(_image_batch, 3)
    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(model, backend)

    @cstorch.trace
    def eval_step(inputs):
        return compiled(inputs)

    compiled.eval()
    eager_model.eval()
    with torch.no_grad():
        for inputs, _ in batches:
            torch.testing.assert_close(
                eval_step(inputs).materialize(), eager_model(inputs), rtol=1e-5, atol=1e-5
            )


def _gpt_batch(g, vocab=128, seq=32, batch=8):
    """Learnable sequences: each row counts up (mod vocab) from a random start."""
    tokens = (torch.randint(0, vocab, (batch, 1), generator=g) + torch.arange(seq + 1)) % vocab
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _gpt_schedule(t, warmup=5, peak=3e-3, end=3e-4, decay=25):
    if t < warmup:
        return ref.linear_lr(t, 0.0, peak, warmup)
    return ref.cosine_decay_lr(t - warmup, peak, end, decay)


@pytest.mark.slow
def test_gpt_adamw_warmup_cosine_clipping_matches_eager_torch():
    model = TinyGPT()
    eager_model = copy.deepcopy(model)
    batches = _batches(_gpt_batch, STEPS)

    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warmup = cstorch.optim.lr_scheduler.LinearLR(
        optimizer, initial_learning_rate=0.0, end_learning_rate=3e-3, total_iters=5
    )
    decay = cstorch.optim.lr_scheduler.CosineDecayLR(
        optimizer, initial_learning_rate=3e-3, end_learning_rate=3e-4, total_iters=25
    )
    scheduler = cstorch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, decay], milestones=[5])
    losses = []

    @cstorch.step_closure
    def record(loss):
        losses.append(loss.item())

    @cstorch.trace
    def training_step(inputs, targets):
        loss = lm_loss(compiled(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        record(loss)
        return loss

    _run_executor(batches, training_step, losses)

    eager_opt = ref.EagerCstorchAdamW(eager_model.parameters(), weight_decay=0.01)
    expected = []
    for t, (inputs, targets) in enumerate(batches):
        loss = lm_loss(eager_model(inputs), targets)
        eager_opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(eager_model.parameters(), 1.0)
        eager_opt.step(_gpt_schedule(t))
        expected.append(loss.item())

    _assert_close(losses, expected)
    assert expected[-1] < expected[0]
    assert training_step.trace_count == 1 and xla_compilations(training_step) == 1
    lr = optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor)
    assert lr.item() == pytest.approx(_gpt_schedule(STEPS), rel=1e-5)


@pytest.mark.slow
def test_step_body_runs_once_and_parameters_live_in_jax():
    model = MLP((784, 64, 10))
    batches = _batches(_mnist_batch, 50)
    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    body_runs = []

    @cstorch.trace
    def training_step(inputs, targets):
        body_runs.append(1)
        loss = torch.nn.functional.cross_entropy(compiled(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    weight = model.net[1].weight
    initial = weight.detach().clone()
    dataloader = cstorch.utils.data.DataLoader(lambda: batches)
    for step, (inputs, targets) in enumerate(cstorch.utils.data.DataExecutor(dataloader)):
        training_step(inputs, targets)
        # Between steps the newest value is a JAX array; nothing is copied back to torch
        # until torch code touches the tensor.
        assert backend._impl.device_state.is_stale(weight), f"synchronised at step {step}"
        if step == 3:  # a torch read sees the newest value, as in eager torch
            device_value = torch.from_numpy(
                np.array(backend._impl.device_state.array_of(weight), copy=True)
            )
            assert torch.equal(weight.detach(), device_value)
            assert not torch.equal(weight.detach(), initial)
            assert not backend._impl.device_state.is_stale(weight)
    assert len(body_runs) == 1
    assert training_step.trace_count == 1 and xla_compilations(training_step) == 1
    # The end of the run (or state_dict) brings the torch objects up to date.
    assert not torch.equal(weight.detach(), initial)
    assert not torch.equal(model.state_dict()["net.1.weight"], initial)
