"""The first run of a program: XLA compiles the step once, the compiler's freed working memory
goes back to the system before the step runs (``host_memory.trim``), and the run gives eager
torch's numbers. The memory it saves is measured by ``benchmarks/bench_memory.py``; here the
order of events is checked: compile, trim, run, and nothing but runs afterwards."""

import jax._src.compiler as jax_compiler  # patched to see which programs XLA compiles
import pytest
import torch

import cerebras.pytorch as cstorch
from jax_backend import host_memory
from jax_backend.state import DeviceState
from tests.training import squared_error_step


@pytest.fixture
def events(monkeypatch):
    log = []
    compile_or_get_cached = jax_compiler.compile_or_get_cached

    def compiling(backend, computation, *args, **kwargs):
        name = str(computation.operation.attributes["sym_name"]).strip('"')
        if name.startswith("jit_pure_step"):  # the step (other jitted helpers are not)
            log.append("compile")
        return compile_or_get_cached(backend, computation, *args, **kwargs)

    update = DeviceState.update

    def ran(self, tensors, arrays):
        log.append("run")
        return update(self, tensors, arrays)

    monkeypatch.setattr(jax_compiler, "compile_or_get_cached", compiling)
    monkeypatch.setattr(host_memory, "trim", lambda: log.append("trim"))
    monkeypatch.setattr(DeviceState, "update", ran)
    yield log
    # The engine's tests get no fresh cstorch state (tests/conftest.py): the backend made here
    # is torn down, or its global module hooks stay for the next test (the graph cache's key
    # would walk them).
    cstorch.config.reset()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def test_the_first_step_compiles_once_then_trims_then_runs(events):
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    y = torch.randn(5, 2, generator=torch.Generator().manual_seed(2))
    reference = _model()
    eager = squared_error_step(reference, torch.optim.SGD(reference.parameters(), lr=0.1))
    expected = [eager(x, y).item() for _ in range(3)]

    model = _model()
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    step = cstorch.trace(
        squared_error_step(compiled, cstorch.optim.SGD(model.parameters(), lr=0.1))
    )
    losses = [step(x, y).item() for _ in range(3)]

    assert losses == pytest.approx(expected, rel=1e-6)
    assert events == ["compile", "trim", "run", "run", "run"]
