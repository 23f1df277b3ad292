"""The flags of a ``DeviceState`` entry change only along ``jax_backend.state.TRANSITIONS``.

Under the ``debug_state`` setting (on for the whole test suite, ``tests/conftest.py``) every
change is checked against the table. Here: the table agrees with what each event does to the
flags; an illegal change raises an error naming the tensor, its state and the event; and a
training run that goes through every legal path a run takes (released state, a view and a
numpy array sharing state memory, an edit through ``.data``, run ends, ``state_dict()``, a
``load_state_dict`` between runs, the backend's teardown) makes only legal changes, and
trains exactly as eager torch does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
import jax_backend.state as state_module
from jax_backend import DeviceState
from jax_backend.config import config
from jax_backend.state import TRANSITIONS, IllegalTransition, _Entry
from jax_backend.state_guard import no_guard
from tests.training import squared_error_step

pytestmark = pytest.mark.core

XS = [torch.randn(8, 128, generator=torch.Generator().manual_seed(i)) for i in range(8)]
YS = [torch.randn(8, 4, generator=torch.Generator().manual_seed(100 + i)) for i in range(8)]


def _entry_in(state_name: str) -> _Entry:
    """An unchecked entry whose flags are those ``state_name`` stands for."""
    entry = _Entry(torch.zeros(2))
    if state_name == "absent":
        return entry
    value, _, reach = state_name.partition("+")
    entry.live = True
    entry.array_is_newer = value in ("stale", "released")
    entry.released = value == "released"
    entry.shared = reach == "shared"
    entry.handed_out = reach == "lent"
    assert entry.state() == state_name
    return entry


def test_each_row_of_the_table_is_what_its_event_does_to_the_flags():
    states = set(state_module._STATES)
    for before, event, after in TRANSITIONS:
        assert {before, after} <= states and event in state_module._EFFECTS
        entry = _entry_in(before)
        values = {"shared": after.endswith("+shared")} if event == "upload" else {}
        entry.transition(event, **values)
        assert entry.state() == after, (before, event, after)
    # Never legal: a released tensor that something reaches unguarded, or one that leaves
    # without its storage given back.
    assert not any("released+shared" in (b, a) for b, _, a in TRANSITIONS)
    assert not any(
        b.startswith("released") and e in ("drop", "rollback") for b, e, _ in TRANSITIONS
    )


def test_an_illegal_transition_raises_naming_the_tensor_its_state_and_the_event():
    config.update("debug_state", True)
    state = DeviceState()
    state.name_of = lambda tensor: "model.weight"
    weight = torch.ones(3)
    state.arrays([weight])
    entry = state._entries[id(weight)]
    assert entry.state() == "synced"
    with pytest.raises(IllegalTransition) as error:
        entry.transition("lose")  # only a released tensor can lose its value
    message = str(error.value)
    assert "model.weight" in message and "'lose'" in message and "'synced'" in message
    assert "fill" not in message.split("legal events")[1]  # nothing to fill when synced
    state.release()


def test_the_check_catches_a_newer_value_being_overwritten_by_an_upload():
    config.update("debug_state", True)
    state = DeviceState()
    weight = torch.ones(3)
    [array] = state.arrays([weight])
    state.update([weight], [array + 1])
    assert state.is_stale(weight)
    state._pending = False  # a bookkeeping bug: the newer value would never be filled
    with no_guard():
        weight.add_(0)  # a torch-side edit: the next step uploads the tensor again
    with pytest.raises(IllegalTransition, match="'drop' is not legal from state 'stale'"):
        state.arrays([weight])


def test_without_debug_state_nothing_is_checked():
    config.update("debug_state", False)
    state = DeviceState()
    weight = torch.ones(3)
    state.arrays([weight])
    entry = state._entries[id(weight)]
    assert entry.checked_by is None
    entry.transition("lose")  # applied as told
    assert entry.state() == "absent"


# ------------------------------------------------------------------ a real run, checked
class Net(torch.nn.Module):
    """An MLP whose first weight (128 KiB) is released between steps, and a buffer the step
    overwrites without reading it (the mean output of the last batch)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(128, 256), torch.nn.Tanh(), torch.nn.Linear(256, 4)
        )
        self.register_buffer("last_mean", torch.zeros(4))

    def forward(self, x):
        out = self.body(x)
        self.last_mean.copy_(out.detach().mean(0))
        return out


def _model():
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():  # a bias made from a numpy array the user keeps
        bias = np.array(model.body[2].bias.numpy(), copy=True)
        model.body[2].bias.data = torch.from_numpy(bias)
    return model, bias


def _train(engine):
    """Two runs of 3 steps: views of the released first weight and of ``last_mean`` taken
    after the first step and read every step, an edit through ``.data`` after the second,
    ``state_dict()`` and ``load_state_dict`` between the runs, the views dropped for the
    second run."""
    model, bias = _model()
    if engine == "cstorch":
        backend = cstorch.backend("CPU")
        compiled = cstorch.compile(model, backend)
        optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        compiled, backend = model, None
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for p in model.parameters():  # cstorch creates state up front; so does this one
            optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)

    body = squared_error_step(compiled, optimizer)
    step = cstorch.trace(body) if engine == "cstorch" else body
    seen, views = [], None
    for run in range(2):
        batches = list(zip(XS[4 * run : 4 * run + 3], YS[4 * run : 4 * run + 3]))
        loader = cstorch.utils.data.DataLoader(lambda: batches)  # noqa: B023 - used in this pass
        runs = cstorch.utils.data.DataExecutor(loader) if engine == "cstorch" else batches
        for i, (x, y) in enumerate(runs):
            step(x, y)
            if run == 0 and views is None:
                views = (model.body[0].weight[0], model.last_mean[:2])
            for view in views or ():
                seen.append(view.detach().clone())
            seen.append(torch.from_numpy(bias.copy()))
            if run == 0 and i == 1:
                model.body[2].weight.data.mul_(0.5)
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            saved["body.0.bias"].add_(0.25)
        model.load_state_dict(saved)
        views = None
    final = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return seen, final, backend


@pytest.mark.filterwarnings(
    "ignore::jax_backend.state.SharedStateWarning"
)  # the views it holds are the point
def test_a_training_run_makes_only_legal_transitions_and_trains_as_eager_torch(monkeypatch):
    config.update("debug_state", True)
    monkeypatch.setattr(DeviceState, "release_min_bytes", 1 << 16)
    taken = []
    transition = _Entry.transition

    def recorded(entry, event, **values):
        assert entry.checked_by is not None  # the check is on for every entry
        before = entry.state()
        transition(entry, event, **values)
        taken.append((before, event, entry.state()))

    monkeypatch.setattr(_Entry, "transition", recorded)
    seen, final, backend = _train("cstorch")
    state = backend._impl.device_state
    state.release()  # the backend's teardown: every tensor leaves with its newest value
    assert not state._entries
    assert set(taken) <= TRANSITIONS  # also checked as they happened: none raised
    events = {event for _, event, _ in taken}
    assert {
        "upload",
        "step-result",
        "release",
        "freed",
        "fill",
        "hand-out",
        "share",
        "drop",
    } <= events, events
    assert ("absent", "upload", "synced+shared") in taken  # the numpy-made bias
    assert ("stale+lent", "share", "stale+shared") in taken  # the view of `last_mean`

    cstorch.backend._reset_for_tests()
    eager_seen, eager_final, _ = _train("eager")
    assert len(seen) == len(eager_seen)
    for i, (ours, theirs) in enumerate(zip(seen, eager_seen)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=f"reading {i}")
    for name in eager_final:
        torch.testing.assert_close(final[name], eager_final[name], rtol=1e-5, atol=1e-6)
