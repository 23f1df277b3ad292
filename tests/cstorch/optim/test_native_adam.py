"""cstorch's AdamW in a traced CPU step with the engine's fused native update
(``cpu_optimizer="native"``, ``jax_backend/native_optimizer.py``): one native call for the
param group, the same training as on XLA's kernels and as eager torch running cstorch's rule
written out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cstorch
from cstorch.core.programs import RecompilationWarning
from tests.training import minimizing


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(20, 300), torch.nn.GELU(), torch.nn.LayerNorm(300), torch.nn.Linear(300, 7)
    )


def _batches(steps):
    """One batch, stepped on ``steps`` times (the loss must fall)."""
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randn(32, 20, generator=gen), torch.randint(0, 7, (32,), generator=gen))
    return [batch] * steps


# eps well above the smallest gradients: with 1e-6 an update of a gradient near zero follows its
# last bits, where the engine's gradients and eager torch's differ (sums in another order).
HYPER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-3, weight_decay=0.05)


# The learning rate changes between steps: a user's number in the param group, a constant of
# cstorch's compiled step, so the step is compiled again, its state carried over.
STEPS, LOWERED_AT, LOWERED_LR = 6, 3, HYPER["lr"] / 4


def _traced(setting, monkeypatch, tmp_path, steps=STEPS):
    """Losses, final parameters, the first weight's ``exp_avg`` through a reference taken
    before training, and the step's lowered program text, on cstorch's AdamW."""
    from cstorch.core import step_introspection

    cstorch.config.reset()  # a backend of its own per setting
    monkeypatch.setenv("CSTORCH_CPU_OPTIMIZER", setting)
    backend = cstorch.backend("CPU", artifact_dir=str(tmp_path / setting))
    model = _model()
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), **HYPER)

    step = cstorch.trace(
        minimizing(lambda x, y: torch.nn.functional.cross_entropy(compiled(x), y), optimizer)
    )
    exp_avg = optimizer.state[next(model.parameters())]["exp_avg"]  # held through training
    losses = []
    for index, (x, y) in enumerate(_batches(steps)):
        if index == LOWERED_AT:
            optimizer.param_groups[0]["lr"] = LOWERED_LR
            with pytest.warns(RecompilationWarning, match="hyperparameter"):
                losses.append(float(step(x, y)))
        else:
            losses.append(float(step(x, y)))
    assert step.trace_count == 2
    entry = step._latest()
    text = entry.program.lower(*step_introspection.example_arguments(entry)).as_text()
    params = [p.detach().clone() for p in model.parameters()]
    return losses, params, exp_avg.clone(), text


def _eager(steps=STEPS):
    """The same training in eager torch, cstorch's AdamW rule written out (eps before the
    bias correction, the powers of beta kept from beta itself), float32 op by op."""
    model = _model()
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    b1, b2 = HYPER["betas"]
    losses = []
    for t, (x, y) in enumerate(_batches(steps), start=1):
        lr = HYPER["lr"] if t <= LOWERED_AT else LOWERED_LR
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        losses.append(float(loss))
        with torch.no_grad():
            for i, p in enumerate(params):
                m[i] = m[i] * b1 + p.grad * (1 - b1)
                v[i] = v[i] * b2 + p.grad * p.grad * (1 - b2)
                u = m[i] / (v[i].sqrt() + HYPER["eps"])
                u = u * (np.sqrt(np.float32(1 - b2**t)) / np.float32(1 - b1**t))
                p -= lr * (u + HYPER["weight_decay"] * p)
                p.grad = None
    return losses, m[0]


def test_a_traced_adamw_step_runs_natively_and_matches_eager_torch(monkeypatch, tmp_path):
    native_losses, native_params, native_m, native_text = _traced("native", monkeypatch, tmp_path)
    xla_losses, xla_params, xla_m, xla_text = _traced("xla", monkeypatch, tmp_path)
    assert native_text.count("cstorch_adam_update") == 1  # one call for the param group
    assert "cstorch_adam_update" not in xla_text
    # XLA's kernels run the same rule: equal up to their fused multiply-adds.
    np.testing.assert_allclose(native_losses, xla_losses, rtol=1e-6)
    for native, xla in zip(native_params, xla_params):
        np.testing.assert_allclose(native, xla, rtol=1e-5, atol=1e-7)
    # A state tensor held from before training shows the last step's value, not a stale one.
    np.testing.assert_allclose(native_m, xla_m, rtol=1e-5, atol=1e-9)
    # Eager torch: the same up to the gradients' own last bits, grown over the steps.
    eager_losses, eager_m = _eager()
    np.testing.assert_allclose(native_losses, eager_losses, rtol=1e-4)
    np.testing.assert_allclose(native_m, eager_m, rtol=1e-3, atol=1e-6)
    assert native_losses[-1] < native_losses[0]  # it trains
