"""``reuse_cpu_step_memory``: a CPU step's temporaries in heaps under glibc's mmap ceiling, so
that malloc keeps them between runs (``host_memory.step_compiler_options``). Off by default,
it must reach XLA when on, and never change a number: buffer assignment only. Its speed and
memory are measured by ``benchmarks/bench_engine.py`` (``benchmarks/cpu_results.md``)."""

import jax._src.compiler as jax_compiler  # patched to see the options the step compiles with
import pytest
import torch

import cerebras.pytorch as cstorch
from jax_backend import config, host_memory
from tests.training import squared_error_step

OPTION = "xla_multiheap_size_constraint_per_heap"


@pytest.fixture
def step_options(monkeypatch):
    """The XLA option overrides of every step compiled while the test runs."""
    seen = []
    compile_or_get_cached = jax_compiler.compile_or_get_cached

    def compiling(backend, computation, devices, compile_options, *args, **kwargs):
        name = str(computation.operation.attributes["sym_name"]).strip('"')
        if name.startswith("jit_pure_step"):
            seen.append(dict(compile_options.env_option_overrides))
        return compile_or_get_cached(backend, computation, devices, compile_options, *args,
                                     **kwargs)

    monkeypatch.setattr(jax_compiler, "compile_or_get_cached", compiling)
    return seen


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))


def _losses(backend, steps=4):
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    y = torch.randn(8, 3, generator=torch.Generator().manual_seed(2))
    model = _model()
    compiled = cstorch.compile(model, backend)
    step = cstorch.trace(squared_error_step(
        compiled, cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)))
    losses = [step(x, y).item() for _ in range(steps)]
    return losses, [p.detach().clone() for p in model.parameters()]


def _eager_losses(steps=4):
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    y = torch.randn(8, 3, generator=torch.Generator().manual_seed(2))
    model = _model()
    step = squared_error_step(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    return [step(x, y).item() for _ in range(steps)]


def test_off_by_default_and_never_asked_off_the_cpu(monkeypatch):
    monkeypatch.delenv("CSTORCH_REUSE_CPU_STEP_MEMORY", raising=False)
    assert host_memory.step_compiler_options("cpu") == {}
    config.config.update("reuse_cpu_step_memory", True)
    assert host_memory.step_compiler_options("cuda") == {}
    assert host_memory.step_compiler_options("any") == {}  # an export: no host heap to keep


def test_the_heaps_stay_under_glibcs_mmap_ceiling():
    config.config.update("reuse_cpu_step_memory", True)
    options = host_memory.step_compiler_options("cpu")
    if host_memory._malloc_trim() is None:
        pytest.skip("not glibc: nothing to keep")
    # glibc's largest mmap threshold on 64-bit is 32 MiB; a bigger heap is unmapped when freed
    assert 16 << 20 <= options[OPTION] < 32 << 20


def test_the_environment_turns_it_on(monkeypatch):
    monkeypatch.setenv("CSTORCH_REUSE_CPU_STEP_MEMORY", "1")
    assert config.reuse_cpu_step_memory.value is True
    monkeypatch.setenv("CSTORCH_REUSE_CPU_STEP_MEMORY", "off")
    assert config.reuse_cpu_step_memory.value is False


def test_on_it_reaches_xla_and_changes_no_number(step_options):
    backend = cstorch.backend("CPU")
    default_losses, default_params = _losses(backend)
    config.config.update("reuse_cpu_step_memory", True)  # read when the next program is built
    losses, params = _losses(backend)

    if host_memory._malloc_trim() is None:
        assert step_options == [{}, {}]
    else:
        assert OPTION not in step_options[0]
        assert int(step_options[1][OPTION]) == host_memory.STEP_HEAP_BYTES
    assert losses == default_losses  # bit for bit: where temporaries live, not what they hold
    for p, q in zip(params, default_params):
        assert torch.equal(p, q)
    assert losses == pytest.approx(_eager_losses(), rel=1e-6)
