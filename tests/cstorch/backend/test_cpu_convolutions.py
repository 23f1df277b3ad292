"""A CPU step's convolutions run on torch's own kernels (``cpu_convolutions``, default
``native``; ``jax_backend/ops/torch_kernels.py``): a CNN in pytorch/examples' MNIST shape
(smaller) trains as eager torch does, its program calls torch through the engine's FFI
library (``native``) or host callbacks (``torch``), and the setting ``xla`` gives XLA's
convolutions back; an export and ``pure_function`` keep XLA's convolutions (no custom call
or host callback), and the exported step trains alike."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from tests.exports import exported_beside
from tests.models import MnistNet

STEPS = 4


def _net():
    """pytorch/examples' MNIST network, narrower, without dropout."""
    return MnistNet(channels=(8, 16), hidden=32, image=16)


def _batches(n=STEPS):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(16, 1, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g))
        for _ in range(n)
    ]


def _weights(model):
    return np.concatenate([p.detach().double().numpy().ravel() for p in model.parameters()])


def _eager(batches):
    torch.manual_seed(0)
    model = _net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    losses = []
    for x, y in batches:
        loss = F.nll_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return np.array(losses), _weights(model)


def _traced(tmp_path):
    torch.manual_seed(0)
    model = _net()
    compiled = cstorch.compile(model, cstorch.backend("CPU", artifact_dir=str(tmp_path)))
    optimizer = cstorch.optim.Adadelta(model.parameters(), lr=1.0)

    @cstorch.trace
    def step(x, y):
        loss = F.nll_loss(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return model, step


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["native", "torch", "xla"])
def test_mnist_shaped_cnn_trains_as_eager_torch(kernels, monkeypatch, tmp_path):
    monkeypatch.setenv("CSTORCH_CPU_CONVOLUTIONS", kernels)
    batches = _batches()
    expected_losses, expected_weights = _eager(batches)
    model, step = _traced(tmp_path)
    losses = np.array([float(step(x, y)) for x, y in batches])
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-6, atol=0)
    weights = _weights(model)
    assert np.linalg.norm(weights - expected_weights) <= 1e-6 * np.linalg.norm(expected_weights)
    program = step.stablehlo()
    assert ("callback" in program) == (kernels == "torch")
    assert ("cstorch_torch_convolution" in program) == (kernels == "native")


@pytest.mark.slow
def test_export_and_pure_function_keep_xlas_convolutions(tmp_path):
    batches = _batches(STEPS + 2)
    model, step = _traced(tmp_path)
    losses = [float(step(x, y)) for x, y in batches[:STEPS]]
    assert "cstorch_torch_convolution" in step.stablehlo()
    assert "conv_general_dilated" in str(
        jax.make_jaxpr(step.pure_function())(
            *step.pure_state()[:2], [t.numpy() for t in batches[0]], 0
        )
    )
    module, theirs, ours = exported_beside(step, batches[STEPS:], tmp_path / "cnn")
    assert "callback" not in module and "cstorch_" not in module
    assert losses  # the run before the export used torch's kernels
    np.testing.assert_allclose(theirs, ours, rtol=1e-6)
