"""A float32 CPU step runs its layer norms, embeddings and loss, forward and backward, as the
engine's native calls (``cpu_layer_norm``, ``cpu_embedding`` and ``cpu_loss``, default
``native``; ``jax_backend/native_layer_norm.py``, ``native_embedding.py``, ``native_loss.py``): a small GPT (tied embedding
and head) trains as eager torch does, as closely as on XLA's kernels (``xla``); the parameters
after training agree; an export keeps XLA's lowerings (no custom call) and trains alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from tests.exports import exported_beside
from tests.models import lm_loss, repeated_token_batches, small_gpt
from tests.training import minimizing

STEPS = 4


def _batches(n=STEPS):
    return repeated_token_batches(n)


def _model():
    return small_gpt()


def _eager(batches):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for x, y in batches:
        loss = lm_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return np.array(losses), [p.detach().numpy() for p in model.parameters()]


def _traced(tmp_path, setting, monkeypatch):
    cstorch.config.reset()  # a backend of its own per setting
    monkeypatch.setenv("CSTORCH_CPU_LAYER_NORM", setting)
    monkeypatch.setenv("CSTORCH_CPU_EMBEDDING", setting)
    monkeypatch.setenv("CSTORCH_CPU_LOSS", setting)
    model = _model()
    compiled = cstorch.compile(model, cstorch.backend("CPU", artifact_dir=str(tmp_path / setting)))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.5)
    step = cstorch.trace(minimizing(lambda x, y: lm_loss(compiled(x), y), optimizer))
    return step, model


@pytest.mark.parametrize("setting", ["native", "xla"])
def test_a_gpt_trains_as_eager_torch(setting, monkeypatch, tmp_path):
    batches = _batches()
    expected, expected_params = _eager(batches)
    step, model = _traced(tmp_path, setting, monkeypatch)
    losses = np.array([float(step(x, y)) for x, y in batches])
    np.testing.assert_allclose(losses, expected, rtol=2e-6, atol=0)
    for got, want in zip(model.parameters(), expected_params):
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-4, atol=1e-6)
    assert losses[-1] < losses[0] - 0.1
    program = step.stablehlo()
    # five layer norms (two per block, the last one), each a forward and a backward call; the
    # token and position embeddings likewise
    native = setting == "native"
    assert (
        program.count("@cstorch_layer_norm(")
        == program.count("@cstorch_layer_norm_backward(")
        == (5 if native else 0)
    )
    assert (
        program.count("@cstorch_embedding(")
        == program.count("@cstorch_embedding_backward(")
        == (2 if native else 0)
    )


def test_export_keeps_xlas_lowerings(monkeypatch, tmp_path):
    batches = _batches(STEPS + 2)
    step, _ = _traced(tmp_path, "native", monkeypatch)
    losses = [float(step(x, y)) for x, y in batches[:STEPS]]
    program = step.stablehlo()
    names = ("cstorch_layer_norm", "cstorch_embedding", "cstorch_log_softmax", "cstorch_nll_loss")
    assert all(name in program for name in names)
    module, theirs, ours = exported_beside(step, batches[STEPS:], tmp_path / "gpt")
    assert not any(name in module for name in names)
    assert losses
    np.testing.assert_allclose(theirs, ours, rtol=1e-5)
