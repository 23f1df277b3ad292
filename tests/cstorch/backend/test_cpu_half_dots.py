"""A CPU step in bfloat16 runs the products XLA's fast kernels refuse (the weight gradients,
the attention's backward) through the engine's layout copy (``cpu_half_dots``, default
``native``; ``jax_backend/ops/layout_copy.py``): a small GPT trains as eager
``torch.autocast("cpu", bfloat16)`` does, as closely as the other two settings (``torch``:
torch's GEMM on the host; ``xla``: XLA's widened dots); an export keeps XLA's products (no
custom call, no host callback) and trains alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from jax_backend.ops import layout_copy
from tests.exports import exported_beside
from tests.models import lm_loss, repeated_token_batches, small_gpt
from tests.training import minimizing

pytestmark = pytest.mark.slow
STEPS = 4


def _batches(n=STEPS):
    return repeated_token_batches(n)


def _model():
    return small_gpt()


def _eager_autocast(batches):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = lm_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return np.array(losses)


def _traced(tmp_path):
    cstorch.amp.set_half_dtype("bfloat16")
    model = _model()
    compiled = cstorch.compile(model, cstorch.backend("CPU", artifact_dir=str(tmp_path)))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.5)
    return cstorch.trace(minimizing(lambda x, y: lm_loss(compiled(x), y), optimizer))


@pytest.mark.parametrize("setting", ["native", "torch", "xla"])
def test_bf16_gpt_trains_as_eager_autocast(setting, monkeypatch, tmp_path):
    monkeypatch.setenv("CSTORCH_CPU_HALF_DOTS", setting)
    batches = _batches()
    expected = _eager_autocast(batches)
    step = _traced(tmp_path)
    losses = np.array([float(step(x, y)) for x, y in batches])
    # bf16 activations: eager autocast and the engine round in some places differently (the
    # engine keeps XLA's float32 fusions), far below one bf16 step of the loss.
    np.testing.assert_allclose(losses, expected, rtol=2e-4, atol=0)  # (measured: 1.7e-5)
    assert losses[-1] < losses[0] - 0.1
    program = step.stablehlo()
    # (native runs as torch where the copy gains nothing: jaxlib 0.7, the compatibility leg)
    copies = setting == "native" and layout_copy.xla_keeps_bf16_dots()
    assert ("cstorch_swap_last_two" in program) == copies
    assert ("callback" in program) == (setting != "xla" and not copies)


def test_the_settings_agree_with_each_other(monkeypatch, tmp_path):
    """The settings compute the same products (float32 sums of bf16 operands), possibly in
    other orders: their losses agree far closer than either with eager autocast."""
    batches = _batches()
    runs = {}
    for setting in ("native", "xla"):
        monkeypatch.setenv("CSTORCH_CPU_HALF_DOTS", setting)
        cstorch.config.reset()
        step = _traced(tmp_path / setting)
        runs[setting] = np.array([float(step(x, y)) for x, y in batches])
    np.testing.assert_allclose(runs["native"], runs["xla"], rtol=1e-5, atol=0)


def test_export_keeps_xlas_products(tmp_path):
    batches = _batches(STEPS + 2)
    step = _traced(tmp_path)
    losses = [float(step(x, y)) for x, y in batches[:STEPS]]
    assert ("cstorch_swap_last_two" in step.stablehlo()) == layout_copy.xla_keeps_bf16_dots()
    module, theirs, ours = exported_beside(step, batches[STEPS:], tmp_path / "gpt")
    assert "cstorch_swap_last_two" not in module and "callback" not in module
    assert losses
    np.testing.assert_allclose(theirs, ours, rtol=2e-3)
