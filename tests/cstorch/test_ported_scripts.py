"""Two torch training scripts in the shapes of public ones, ported as the porting guide says,
give eager torch's numbers at every step, on CPU and on CSX in float32, each with one
training program.

* nanoGPT-shaped (karpathy/nanoGPT's ``train.py``): a GPT, torch's AdamW with a decay and a
  no-decay param group, a Python-float learning rate set on every group before each
  iteration from a warm-up/cosine function, gradient accumulation over micro-batches, a
  (disabled, as in float32) ``GradScaler``, ``clip_grad_norm_``, and a periodic evaluation
  in eval mode.
* MNIST-shaped (pytorch/examples' ``mnist/main.py``): a CNN with log-softmax and NLL loss,
  ``torch.optim.Adadelta``, torch's ``StepLR`` stepped once per epoch, and a test pass each
  epoch summing the loss and counting correct predictions. (Its dropout is left out: random
  numbers in a compiled step come from JAX, README "Deliberate differences".)

The scripts are written here, in those shapes; nothing is copied from the projects.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from cstorch.core.compile import RecompilationWarning
from tests.models import MnistNet, TinyGPT, lm_loss

TOL = dict(rtol=1e-5, atol=1e-6)


def _backend(engine):
    if engine == "CSX":
        from cstorch.distributed import ClusterConfig

        backend = cstorch.backend("CSX", cluster_config=ClusterConfig(num_csx=1))
        cstorch.amp.enable_mixed_precision(False)  # the guide's way to run CSX in float32
        return backend
    return cstorch.backend("CPU")


def _compiled(engine, model):
    return model if engine == "eager" else cstorch.compile(model, _backend(engine))


def _traced(engine, fn):
    return fn if engine == "eager" else cstorch.trace(fn)


# ---------------------------------------------------------------------------- nanoGPT
ITERS, ACCUMULATION, EVAL_INTERVAL, BATCH, SEQ, VOCAB = 10, 2, 4, 2, 16, 64


def _get_lr(it, learning_rate=6e-3, warmup=3, decay_iters=8, min_lr=6e-4):
    if it < warmup:
        return learning_rate * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def _batches(seed, count):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, VOCAB, (count, ACCUMULATION, BATCH, SEQ + 1), generator=g)
    return data[..., :-1].contiguous(), data[..., 1:].contiguous()


def _nanogpt_shaped(engine):
    """Returns (train losses, eval losses, learning rates, model)."""
    torch.manual_seed(0)
    model = TinyGPT(vocab=VOCAB, d=32, heads=2, layers=2, seq=SEQ)
    forward = _compiled(engine, model)
    parameters = {n: p for n, p in model.named_parameters() if p.requires_grad}
    groups = [
        {"params": [p for p in parameters.values() if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in parameters.values() if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=6e-3, betas=(0.9, 0.95))
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # float32: a no-op, as in the script

    def train_step(xs, ys):
        for micro in range(ACCUMULATION):
            loss = lm_loss(forward(xs[micro]), ys[micro]) / ACCUMULATION
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss * ACCUMULATION

    @torch.no_grad()
    def eval_step(x, y):
        return lm_loss(forward(x), y)

    train_step, eval_step = _traced(engine, train_step), _traced(engine, eval_step)
    xs, ys = _batches(1, ITERS)
    eval_x, eval_y = _batches(2, 2)
    losses, evals, lrs = [], [], []
    for it in range(ITERS):
        lr = _get_lr(it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        lrs.append(lr)
        if it % EVAL_INTERVAL == 0:
            model.eval()
            evals.append(sum(float(eval_step(eval_x[k, 0], eval_y[k, 0])) for k in range(2)) / 2)
            model.train()
        losses.append(float(train_step(xs[it], ys[it])))
    return losses, evals, lrs, model, train_step


@pytest.mark.slow  # (about 13 s of CPU each)
@pytest.mark.parametrize("engine", ["CPU", "CSX"])
def test_a_nanogpt_shaped_script_gives_eagers_numbers(engine):
    expected, expected_evals, expected_lrs, eager_model, _ = _nanogpt_shaped("eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompilationWarning)
        losses, evals, lrs, model, train_step = _nanogpt_shaped(engine)
    assert lrs == expected_lrs
    torch.testing.assert_close(losses, expected, **TOL)
    torch.testing.assert_close(evals, expected_evals, **TOL)
    for (name, mine), theirs in zip(model.named_parameters(), eager_model.parameters()):
        mine, theirs = mine.detach(), theirs.detach()
        if name.endswith("qkv.bias"):  # the key bias: no effect on the loss, a gradient of
            keys = slice(mine.numel() // 3, 2 * mine.numel() // 3)  # rounding noise only,
            mine[keys] = theirs[keys] = 0  # which AdamW scales up to steps of size lr
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5, msg=name)
    assert len(train_step.programs) == 1  # every learning rate: the same program


# ------------------------------------------------------------------------------ MNIST
EPOCHS, BATCHES_PER_EPOCH = 3, 3


def _mnist_data(seed, count):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 1, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g))
        for _ in range(count)
    ]


def _mnist_shaped(engine):
    """Returns (train losses, per-epoch test (loss, correct), learning rates, model)."""
    torch.manual_seed(0)
    model = MnistNet(channels=(4, 8), hidden=16, image=12)
    forward = _compiled(engine, model)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)

    def train_step(data, target):
        optimizer.zero_grad()
        loss = F.nll_loss(forward(data), target)
        loss.backward()
        optimizer.step()
        return loss

    @torch.no_grad()
    def test_step(data, target):
        output = forward(data)
        loss = F.nll_loss(output, target, reduction="sum")
        correct = output.argmax(dim=1, keepdim=True).eq(target.view(-1, 1)).sum()
        return loss, correct

    train_step, test_step = _traced(engine, train_step), _traced(engine, test_step)
    train, test = _mnist_data(3, BATCHES_PER_EPOCH), _mnist_data(4, 2)
    losses, tests, lrs = [], [], []
    for _ in range(EPOCHS):
        model.train()
        for data, target in train:
            losses.append(float(train_step(data, target)))
        model.eval()
        total, correct = 0.0, 0
        for data, target in test:
            loss, right = test_step(data, target)
            total, correct = total + float(loss), correct + int(right)
        tests.append((total / 16, correct))
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    return losses, tests, lrs, model, train_step


@pytest.mark.parametrize("engine", ["CPU", pytest.param("CSX", marks=pytest.mark.slow)])
def test_an_mnist_shaped_script_gives_eagers_numbers(engine):
    expected, expected_tests, expected_lrs, eager_model, _ = _mnist_shaped("eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompilationWarning)
        losses, tests, lrs, model, train_step = _mnist_shaped(engine)
    assert lrs == pytest.approx(expected_lrs, rel=1e-12)
    torch.testing.assert_close(losses, expected, **TOL)
    assert [c for _, c in tests] == [c for _, c in expected_tests]
    torch.testing.assert_close([t for t, _ in tests], [t for t, _ in expected_tests], **TOL)
    for mine, theirs in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(mine.detach(), theirs.detach(), rtol=1e-5, atol=1e-5)
    assert len(train_step.programs) == 1
