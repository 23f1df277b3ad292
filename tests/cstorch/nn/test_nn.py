"""cstorch.nn: losses, custom losses, functional fallbacks, Parameter/Buffer, Scope and
SelectiveGrad."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from cerebras.pytorch.nn import functional as F

import cerebras.pytorch as cstorch
from cerebras.pytorch import nn
from cstorch.utils.data import DataExecutor, DataLoader

torch.manual_seed(0)
X, Y = torch.randn(6, 5), torch.randn(6, 5)


@pytest.mark.parametrize(
    "name",
    [
        "BCEWithLogitsLoss",
        "L1Loss",
        "MSELoss",
        "KLDivLoss",
        "CrossEntropyLoss",
        "TripletMarginWithDistanceLoss",
    ],
)
def test_torch_losses_accept_use_autogen(name):
    ours = getattr(nn, name)(reduction="sum", use_autogen=True)
    assert isinstance(ours, getattr(torch.nn, name)) and ours.autogen_enabled is True
    assert list(inspect.signature(type(ours)).parameters)[-1] == "use_autogen"
    theirs = getattr(torch.nn, name)(reduction="sum")
    if name == "CrossEntropyLoss":
        args = (X, torch.tensor([0, 1, 2, 3, 4, 0]))
    elif name == "BCEWithLogitsLoss":
        args = (X, torch.rand(6, 5))
    elif name == "TripletMarginWithDistanceLoss":
        args = (X, Y, X.flip(0))
    elif name == "KLDivLoss":
        args = (torch.log_softmax(X, -1), torch.softmax(Y, -1))
    else:
        args = (X, Y)
    assert torch.allclose(ours(*args), theirs(*args))


def test_torch_loss_arguments_may_be_positional():
    assert nn.CrossEntropyLoss(None, None, 7).ignore_index == 7
    assert nn.TripletMarginWithDistanceLoss(None, 2.5).margin == 2.5


@pytest.mark.parametrize(
    "ours,theirs,args",
    [
        (nn.HuberLoss(delta=0.7), torch.nn.HuberLoss(delta=0.7), (X, Y)),
        (
            nn.SmoothL1Loss(beta=0.5, reduction="sum"),
            torch.nn.SmoothL1Loss(beta=0.5, reduction="sum"),
            (X, Y),
        ),
        (
            nn.SmoothL1Loss(reduction="none", use_autogen=True),
            torch.nn.SmoothL1Loss(reduction="none"),
            (X, Y),
        ),
        (
            nn.GaussianNLLLoss(full=True),
            torch.nn.GaussianNLLLoss(full=True),
            (X, Y, torch.rand(6, 5) + 1e-8),
        ),
        (nn.GaussianNLLLoss(), torch.nn.GaussianNLLLoss(), (X, Y, torch.rand(6) + 0.1)),
        (nn.MultiMarginLoss(), torch.nn.MultiMarginLoss(), (X, torch.tensor([0, 1, 2, 3, 4, 0]))),
        (
            nn.MultiMarginLoss(p=2, margin=0.5, weight=torch.rand(5), reduction="sum"),
            None,
            (X, torch.tensor([0, 1, 2, 3, 4, 0])),
        ),
    ],
)
def test_custom_losses_match_torch(ours, theirs, args):
    if theirs is None:  # same weight as ours
        theirs = torch.nn.MultiMarginLoss(p=2, margin=0.5, weight=ours.weight, reduction="sum")
    x = args[0].clone().requires_grad_()
    expected_x = args[0].clone().requires_grad_()
    got, expected = ours(x, *args[1:]), theirs(expected_x, *args[1:])
    assert torch.allclose(got, expected, atol=1e-6)
    got.sum().backward()
    expected.sum().backward()
    assert torch.allclose(x.grad, expected_x.grad, atol=1e-6)


def test_custom_loss_argument_checks():
    with pytest.raises(AssertionError):
        nn.HuberLoss(delta=0)
    with pytest.raises(AssertionError):
        nn.SmoothL1Loss(beta=-1)
    with pytest.raises(AssertionError):
        nn.MultiMarginLoss(reduction="none")
    with pytest.raises(ValueError, match="var"):
        nn.GaussianNLLLoss()(X, Y, torch.ones(3))


def test_dice_losses_against_numpy():
    g = np.random.default_rng(0)
    logits = torch.tensor(g.normal(size=(2, 3, 4, 4, 2)), dtype=torch.float32)
    target = torch.tensor(g.integers(0, 3, (2, 4, 4, 2)))
    scores = nn.DiceLoss(num_classes=3)(logits, target, list(logits.shape))
    probs = torch.softmax(logits, 1).numpy()
    onehot = np.moveaxis(np.eye(3)[target.numpy()], -1, 1)
    probs[:, 0] = onehot[:, 0] = 0  # background excluded
    inter = (probs * onehot).sum(axis=(2, 3, 4))
    expected = 2 * inter / (probs.sum(axis=(2, 3, 4)) + onehot.sum(axis=(2, 3, 4)) + 1e-6)
    assert scores.shape == (2, 3) and np.allclose(scores.numpy(), expected, atol=1e-5)
    combined = nn.DiceCELoss(3, include_background=False)(logits, target, list(logits.shape))
    ce = torch.nn.functional.cross_entropy(logits, target)
    assert torch.allclose(combined, 0.5 * ce + 0.5 * (1 - 1.5 * scores.mean()), atol=1e-5)


def test_functional_fallbacks():
    assert F.one_hot(torch.tensor([2, 0]), 3).tolist() == [[0, 0, 1], [1, 0, 0]]
    assert F.one_hot(torch.tensor([1]), 2).dtype == torch.int32
    mask = torch.tensor([0, 1, 1, 1, 0, 0, 1])
    assert F.conditional_arange(mask, torch.tensor(2), torch.tensor(7)).tolist() == [
        -1,
        2,
        9,
        16,
        -1,
        -1,
        23,
    ]
    stat = F.nth_order_statistic(torch.tensor([0, 2, 3, 5, 4, 1, 6]), 3, 0)
    assert stat.tolist() == [0, 0, 0, 1, 1, 0, 1] and stat.dtype == torch.int16
    x, w = torch.randn(2, 5, 3), torch.randn(4, 3)
    assert torch.allclose(F.ranged_matmul(w, x, torch.tensor([1, 5])), x @ w.T)
    mask = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 1, 1, 1]])
    assert torch.allclose(F.sparse_act_matmul(x, mask, w), (x @ w.T) * mask[..., None])
    assert torch.allclose(F.matmul(w, x[0].T), w @ x[0].T)
    bias = torch.randn(5)
    assert torch.allclose(F.bias_add(x, bias, 1), x + bias[None, :, None])
    with pytest.raises(AssertionError):
        F.bias_add(x, bias, 2)
    assert [t.tolist() for t in F.unbind(torch.arange(4).view(2, 2))] == [[0, 1], [2, 3]]
    scope = nn.Scope("s")
    y = scope(x.requires_grad_())
    scope.exit(y).sum().backward()
    assert torch.equal(y, x) and torch.equal(x.grad, torch.ones_like(x))
    with pytest.raises(ValueError):
        F.scope_boundary(x, "MIDDLE", "s")


def test_sparse_matmul_matches_its_dense_definition():
    g = torch.Generator().manual_seed(0)
    values = torch.randn(3, 2, 4, generator=g)  # (M, b, N): 2 of 5 sparse rows present
    indices = torch.tensor([[0, 3], [1, 4], [2, 3]])
    weight = torch.randn(6, 5, 4, generator=g)  # (K, B, N)
    out = F.sparse_matmul(values, indices, weight)
    for m in range(3):
        for j, b in enumerate(indices[m]):
            assert torch.allclose(out[m, j], weight[:, b] @ values[m, j], atol=1e-5)


def test_parameter_and_buffer_behave_as_torch_tensors():
    p = nn.Parameter(torch.ones(2))
    assert isinstance(p, torch.nn.Parameter) and p.requires_grad
    assert nn.Parameter(p) is p and nn.Parameter().numel() == 0
    b = nn.Buffer(torch.zeros(3))
    assert isinstance(b, torch.Tensor) and not b.requires_grad and (b + 1).sum() == 3


def test_selective_grad_trains_only_selected_entries_in_a_compiled_step(cpu_backend):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    compiled = cstorch.compile(model, cpu_backend)
    mask = torch.tensor([[True, False, True, False]] * 3)
    model.apply(nn.SelectiveGrad("weight", init_method=lambda p: mask))
    assert torch.equal(model.weight_requires_grad, mask)
    assert "weight_requires_grad" in model.state_dict()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    before = model.weight.detach().clone()
    bias_before = model.bias.detach().clone()

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    for x in DataExecutor(DataLoader(lambda: [torch.randn(8, 4) for _ in range(3)]), num_steps=3):
        step(x)
    weight = model.state_dict()["weight"]
    assert torch.equal(weight[~mask], before[~mask])
    assert not torch.equal(weight[mask], before[mask])
    assert not torch.equal(model.bias.detach(), bias_before)


def test_selective_grad_validation():
    with pytest.raises(ValueError):
        nn.SelectiveGrad("w", init_method="nope")
    with pytest.raises(ValueError):
        nn.SelectiveGrad(lambda name: True)
    with pytest.raises(TypeError):
        nn.SelectiveGrad("w").apply(object())
    outlier = nn.SelectiveGrad("*")
    layer = torch.nn.Linear(50, 4)
    outlier.apply(layer)
    assert layer.weight_requires_grad.dtype == torch.bool and layer.bias_requires_grad.shape == (4,)
