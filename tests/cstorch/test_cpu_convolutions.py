"""A CPU step's convolutions run on torch's own kernels (``cpu_convolutions``, default
``torch``; ``jax_backend/ops/torch_kernels.py``): a CNN in pytorch/examples' MNIST shape
(smaller) trains as eager torch does, its program calls torch on the host, and the setting
``xla`` gives XLA's convolutions back; an export and ``pure_function`` keep XLA's
convolutions (no host callback), and the exported step trains alike."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from jax_backend import exported

STEPS = 4


class MnistNet(torch.nn.Module):
    """pytorch/examples' MNIST network, narrower, without dropout."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, 1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, 1)
        self.fc1 = torch.nn.Linear(16 * 6 * 6, 32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        x = torch.flatten(F.max_pool2d(x, 2), 1)
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def _batches(n=STEPS):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 1, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g))
            for _ in range(n)]


def _weights(model):
    return np.concatenate([p.detach().double().numpy().ravel() for p in model.parameters()])


def _eager(batches):
    torch.manual_seed(0)
    model = MnistNet()
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
    model = MnistNet()
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
@pytest.mark.parametrize("kernels", ["torch", "xla"])
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


@pytest.mark.slow
def test_export_and_pure_function_keep_xlas_convolutions(tmp_path):
    batches = _batches(STEPS + 2)
    model, step = _traced(tmp_path)
    losses = [float(step(x, y)) for x, y in batches[:STEPS]]
    assert "callback" in step.stablehlo()
    assert "conv_general_dilated" in str(jax.make_jaxpr(step.pure_function())(
        *step.pure_state()[:2], [t.numpy() for t in batches[0]], 0))
    artifact = cstorch.export(step, batches[STEPS], str(tmp_path / "cnn"))
    exported_step = exported.load(artifact)
    assert "callback" not in str(exported_step.exported.mlir_module())
    theirs = [float(exported_step(*(t.numpy() for t in batch))) for batch in batches[STEPS:]]
    ours = [float(step(x, y)) for x, y in batches[STEPS:]]
    assert losses  # the run before the export used torch's kernels
    np.testing.assert_allclose(theirs, ours, rtol=1e-6)
