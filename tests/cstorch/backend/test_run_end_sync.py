"""The end of a DataExecutor run copies no released state back to torch.

Released tensors (large state nothing else holds) are filled by their guard on first
access, so the run's end leaves them on the device side; what torch reads afterwards --
parameters, optimizer state, ``state_dict()``, a view made before the run -- is still the
newest value, as eager torch shows it. When a full copy does happen, every transfer is
started before the first one is waited for.
"""

from __future__ import annotations

import pytest
import torch

import cerebras.pytorch as cstorch
import jax_backend.state
from jax_backend import DeviceState
from jax_backend.state import SharedStateWarning
from tests.training import compiled_sgd_step

pytestmark = pytest.mark.core

XS = [torch.randn(8, 6, generator=torch.Generator().manual_seed(i)) for i in range(6)]
YS = [torch.randn(8, 3, generator=torch.Generator().manual_seed(100 + i)) for i in range(6)]


@pytest.fixture
def release_all(monkeypatch):
    monkeypatch.setattr(DeviceState, "release_min_bytes", 0)


@pytest.fixture
def copies(monkeypatch):
    """Counts device-to-torch copies of state values (``DeviceState._fill``'s reads)."""
    count = {"n": 0}
    original = jax_backend.state.array_to_numpy

    def counted(array):
        count["n"] += 1
        return original(array)

    monkeypatch.setattr(jax_backend.state, "array_to_numpy", counted)
    return count


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _eager(steps):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in zip(XS[:steps], YS[:steps]):
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, optimizer


def _run(steps, before_run=None):
    backend = cstorch.backend("CPU")
    model = _model()
    optimizer, step = compiled_sgd_step(model, backend)
    held = before_run(model) if before_run else None

    batches = list(zip(XS[:steps], YS[:steps]))
    for x, y in cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(lambda: batches)):
        step(x, y)
    return backend._impl.device_state, model, optimizer, held


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_run_end_copies_no_released_state_and_reads_are_newest(release_all, copies):
    state, model, optimizer, _ = _run(4)
    assert copies["n"] == 0  # four parameters, four momentum buffers: none copied back
    assert state.has_pending
    eager_model, eager_optimizer = _eager(4)
    for p, e in zip(model.parameters(), eager_model.parameters()):
        _close(p.detach().clone(), e.detach())
    assert copies["n"] == 4  # each read filled exactly its own tensor
    for p, e in zip(model.parameters(), eager_model.parameters()):
        _close(optimizer.state[p]["momentum_buffer"], eager_optimizer.state[e]["momentum_buffer"])
    assert copies["n"] == 8


def test_state_dict_after_a_run_is_the_newest(release_all):
    _, model, _, _ = _run(5)
    eager_model, _ = _eager(5)
    for (_name, value), (_, expected) in zip(
        model.state_dict().items(), eager_model.state_dict().items()
    ):
        _close(value, expected)


def test_a_view_made_before_the_run_sees_the_newest_value_after_it(release_all):
    """A view reads the storage without the guard: its base is never released, and the run's
    end brings it up to date, as eager torch's in-place updates would have."""
    with pytest.warns(SharedStateWarning, match="0.weight"):
        state, model, _, view = _run(3, before_run=lambda m: m[0].weight.detach()[:2])
    eager_model, _ = _eager(3)
    assert not state.is_released(model[0].weight)
    with torch._C.DisableTorchFunctionSubclass():  # read as a user holding the view would
        _close(view.clone(), eager_model[0].weight.detach()[:2])


def test_small_state_is_brought_up_to_date_at_the_run_end(copies):
    """Tensors kept in torch (small ones, by default) are synchronised as before."""
    state, model, _, _ = _run(2)
    assert copies["n"] == 8 and not state.has_pending


def test_materialize_starts_every_transfer_before_waiting(release_all, monkeypatch):
    state, model, optimizer, _ = _run(2)
    events = []
    original_fill = DeviceState._fill

    def fill(self, entry):
        events.append("fill")
        return original_fill(self, entry)

    def start(arrays):
        arrays = list(arrays)
        events.extend(["start"] * len(arrays))

    monkeypatch.setattr(DeviceState, "_fill", fill)
    monkeypatch.setattr(jax_backend.state, "_start_reads", start)
    state.materialize()
    assert events == ["start"] * 8 + ["fill"] * 8
