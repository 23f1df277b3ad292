"""State lives on the JAX side between steps; torch-side changes must reach the next step."""

import copy

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.jit_cache import xla_compilations
from tests.training import minimizing


def _setup():
    backend = cstorch.backend("CPU")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=0.1)

    step = cstorch.trace(minimizing(lambda x: compiled(x).pow(2).sum(), optimizer))

    return model, optimizer, step


@pytest.mark.slow
def test_load_state_dict_between_steps_resumes_exactly():
    model, optimizer, step = _setup()
    xs = [torch.randn(2, 4, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    for x in xs[:3]:
        step(x)
    saved = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    expected = [step(x).item() for x in xs[3:]]
    model.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])  # replaces the optimizer's state tensors
    resumed = [step(x).item() for x in xs[3:]]
    assert resumed == expected
    assert step.trace_count == 1 and xla_compilations(step) == 1


@pytest.mark.slow
def test_in_place_torch_edits_between_steps_are_uploaded():
    model, _, step = _setup()
    x = torch.ones(1, 4)
    step(x)
    with torch.no_grad():
        model.state_dict()  # bring torch up to date first
        model.weight.zero_()
        model.bias.zero_()
    assert step(x).item() == 0.0


def test_materialized_state_matches_device_state_after_each_sync():
    model, optimizer, step = _setup()
    x = torch.ones(1, 4)
    for _ in range(3):
        step(x)
    state = model.state_dict()
    exp_avg = optimizer.state_dict()["state"][0]["exp_avg"]
    assert not torch.equal(state["weight"], torch.zeros_like(state["weight"]))
    assert torch.count_nonzero(exp_avg) > 0
    before = state["weight"].clone()
    del state, exp_avg  # kept across the step, they would be aliases the step writes through
    step(x)
    assert not torch.equal(model.state_dict()["weight"], before)


def test_closures_called_outside_the_step_see_current_state_values():
    backend = cstorch.backend("CPU")
    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = cstorch.optim.lr_scheduler.LinearLR(
        optimizer, initial_learning_rate=1.0, end_learning_rate=0.0, total_iters=4
    )
    seen = []

    @cstorch.step_closure
    def record(lr):
        seen.append(lr.item())

    @cstorch.trace
    def step(x):
        loss = compiled(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        return loss

    loader = cstorch.utils.data.DataLoader(lambda: [torch.ones(1, 2)] * 3)
    for x in cstorch.utils.data.DataExecutor(loader):
        step(x)
        record(optimizer.param_groups[0]["lr"])  # a state tensor, newest value on device
    assert seen == [0.75, 0.5, 0.25]
