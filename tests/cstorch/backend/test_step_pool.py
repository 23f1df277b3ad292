"""``cpu_step_memory="pool"``: a CPU step's working memory kept between runs by the engine's
own pool (``jax_backend/step_pool.py``, native/step_pool.c), instead of being mapped afresh by
glibc each run. It may change where the temporaries live, never what they hold: the numbers
are bit for bit those of ``lean`` (the same program), and equal eager torch's. Its speed is
measured by ``benchmarks/bench_engine.py --step-memory pool`` (``benchmarks/cpu_results.md``)."""

import ctypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from jax_backend import config, host_memory, step_pool
from tests.cstorch.backend.test_cpu_step_memory import _eager_losses, _lean_option, _run

# core: the pool patches jaxlib's library, whose build differs between JAX versions
pytestmark = [
    pytest.mark.core,
    pytest.mark.skipif(
        host_memory.pool_unavailable() is not None,
        reason=f"the pool cannot run here: {host_memory.pool_unavailable()}",
    ),
]


@pytest.fixture(autouse=True)
def _released():
    yield
    step_pool.release()


def _native_stats() -> list:
    """The native counters (still readable once released, unlike ``stats``)."""
    out = (ctypes.c_long * 4)()
    step_pool._native().pool_stats(out)
    return list(out)


def test_a_pooled_step_reuses_its_working_memory_and_changes_no_number():
    backend = cstorch.backend("CPU")
    config.config.update("cpu_step_memory", "lean")
    lean_losses, lean_params, _ = _run(backend, steps=6)
    assert not step_pool.installed()  # only the choice installs it

    config.config.update("cpu_step_memory", "pool")
    assert host_memory.step_compiler_options("cpu") == _lean_option()  # the same program
    losses, params, program = _run(backend, steps=6)
    assert step_pool.installed()
    stats = step_pool.stats()
    # Six runs of one program: the first allocations come from glibc, every later run's
    # working memory from the pool (two blocks at most: a run may start before the last frees)
    assert stats["misses"] <= 2 and stats["hits"] >= 4 and stats["cached"] <= step_pool.KEEP

    assert losses == lean_losses  # bit for bit
    for p, q in zip(params, lean_params):
        assert torch.equal(p, q)
    assert losses == pytest.approx(_eager_losses(steps=6), rel=1e-6)


def test_release_frees_the_kept_blocks_and_puts_the_allocator_back():
    backend = cstorch.backend("CPU")
    config.config.update("cpu_step_memory", "pool")
    _run(backend, steps=4)
    assert step_pool.installed() and step_pool.stats()["cached"] >= 1
    first = step_pool.stats()

    backend._impl.shutdown()  # a backend's end (cstorch.config.reset) releases the pool
    assert not step_pool.installed()
    hits, misses, released, cached = _native_stats()
    assert cached == 0 and released >= 1

    # jaxlib's allocations no longer pass through the pool: a program whose working memory is
    # of a size the pool registered before runs without changing its counters.
    step_pool._native().pool_register(1 << 20, 2)
    f = jax.jit(lambda x: jnp.sort(x * 2.0)[::-1] + 1.0)
    x = np.arange(1 << 18, dtype=np.float32)
    for _ in range(3):
        out = np.asarray(f(x))
    assert _native_stats()[:2] == [hits, misses]
    np.testing.assert_array_equal(out, np.sort(x * 2.0)[::-1] + 1.0)
    step_pool._native().pool_clear()

    # A later backend installs it afresh: its counts start from zero (the same runs, the same
    # number of requests), and nothing of the first install's blocks is handed out.
    cstorch.config.reset()
    backend = cstorch.backend("CPU")
    config.config.update("cpu_step_memory", "pool")
    _run(backend, steps=4)
    again = step_pool.stats()
    assert again["hits"] + again["misses"] == first["hits"] + first["misses"]
    assert again["released"] <= first["released"]


def test_the_pool_serves_only_the_sizes_registered():
    """A jitted program of the user's, run while the pool is installed, is served by glibc
    unless its working memory has a registered size; with it registered, its runs reuse one
    block and give the same result."""
    f = jax.jit(lambda x: jnp.cumsum(jnp.tanh(x) * x, axis=0) - x.sum())
    x = np.random.default_rng(0).standard_normal((1024, 512), dtype=np.float32)
    expected = np.asarray(f(x))
    temp = f.lower(x).compile().memory_analysis().temp_size_in_bytes
    assert temp > 0

    step_pool.keep(temp + 64)  # installs it; a size no program here allocates
    before = step_pool.stats()
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(x)), expected)
    assert step_pool.stats()["hits"] == before["hits"]

    step_pool.keep(temp)
    for _ in range(4):
        np.testing.assert_array_equal(np.asarray(f(x)), expected)
    after = step_pool.stats()
    assert after["hits"] - before["hits"] >= 2 and after["cached"] <= step_pool.KEEP


def test_where_the_pool_cannot_run_the_setting_says_why_before_any_step(monkeypatch, tmp_path):
    config.config.update("cpu_step_memory", "pool")
    monkeypatch.setattr(step_pool, "NATIVE", str(tmp_path / "missing.so"))
    with pytest.raises(RuntimeError, match=r"pool.*not built.*make native.*use 'lean'"):
        host_memory.step_compiler_options("cpu")
    assert host_memory.step_compiler_options("cuda") == {}  # off the CPU: nothing asked
    assert not host_memory.pooled("cuda")


def test_auto_the_default_pools_a_step_and_changes_no_number():
    assert config.cpu_step_memory.value == "auto"
    backend = cstorch.backend("CPU")
    losses, params, _ = _run(backend, steps=6)
    stats = step_pool.stats()
    assert step_pool.installed() and stats["hits"] >= 4
    assert step_pool.kept_bytes() <= host_memory.AUTO_POOL_BYTES
    assert not step_pool.installed(step_pool.TORCH_LIBRARY)  # no torch kernels in this step

    cstorch.config.reset()  # releases the pool
    backend = cstorch.backend("CPU")
    config.config.update("cpu_step_memory", "lean")
    lean_losses, lean_params, _ = _run(backend, steps=6)
    assert not step_pool.installed()
    assert losses == lean_losses  # bit for bit
    for p, q in zip(params, lean_params):
        assert torch.equal(p, q)


def test_auto_runs_a_step_over_its_limit_or_without_the_helper_as_lean(monkeypatch, tmp_path):
    backend = cstorch.backend("CPU")
    lean_losses, _, _ = _run(backend, steps=3)  # (auto, pooled)
    cstorch.config.reset()

    monkeypatch.setattr(host_memory, "AUTO_POOL_BYTES", 1024)  # smaller than any step here
    backend = cstorch.backend("CPU")
    assert _run(backend, steps=3)[0] == lean_losses
    assert not step_pool.installed()
    cstorch.config.reset()

    monkeypatch.setattr(host_memory, "AUTO_POOL_BYTES", 1 << 30)
    monkeypatch.setattr(step_pool, "NATIVE", str(tmp_path / "missing.so"))
    assert host_memory.step_compiler_options("cpu") == _lean_option()  # nothing raised
    backend = cstorch.backend("CPU")
    assert _run(backend, steps=3)[0] == lean_losses
    assert not step_pool.installed()


class _ConvNet(torch.nn.Module):
    """Two convolutions whose outputs and gradients are 2-4 MiB at batch 16: blocks the range
    rule pools (``step_pool.TORCH_BLOCK_BYTES``)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.head(x.mean(dim=(2, 3)))


def _conv_run(backend, steps):
    """(losses, parameters after) of a traced SGD run of ``_ConvNet``; eager torch's where
    ``backend`` is None."""
    torch.manual_seed(0)
    model = _ConvNet()
    runner = model if backend is None else cstorch.compile(model, backend)
    optimizer = (torch.optim if backend is None else cstorch.optim).SGD(
        model.parameters(), lr=0.05, momentum=0.9
    )

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(runner(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    if backend is not None:
        step = cstorch.trace(step)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
    losses = [step(x, y).item() for _ in range(steps)]
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("route", ["native", "torch"])
def test_a_step_with_torchs_kernels_pools_their_blocks_and_changes_no_number(route, monkeypatch):
    """The convolutions run on torch's kernels (cpu_convolutions "native", the default, or
    "torch"), whose outputs and buffers torch allocates afresh each run: under ``auto`` the
    pool keeps those too (torch's and jaxlib's blocks of 1 MiB or more), serving most of each
    later run's, with the numbers of ``lean`` bit for bit."""
    monkeypatch.setenv("CSTORCH_CPU_CONVOLUTIONS", route)
    backend = cstorch.backend("CPU")
    config.config.update("cpu_step_memory", "lean")
    lean_losses, lean_params = _conv_run(backend, steps=6)
    assert not step_pool.installed(step_pool.TORCH_LIBRARY)
    cstorch.config.reset()

    backend = cstorch.backend("CPU")  # auto, the default
    losses, params = _conv_run(backend, steps=6)
    assert step_pool.installed(step_pool.TORCH_LIBRARY) and step_pool.installed()
    stats = step_pool.stats()
    # 2 forward outputs, 2 gradients and oneDNN's buffers per run, pooled from the second
    assert stats["hits"] >= 5 * 4, stats
    assert step_pool.kept_bytes() <= host_memory.AUTO_POOL_BYTES + step_pool.TORCH_BLOCKS_BUDGET

    assert losses == lean_losses  # bit for bit
    for p, q in zip(params, lean_params):
        assert torch.equal(p, q)
    assert losses == pytest.approx(_conv_run(None, steps=6)[0], rel=1e-5)


def test_the_range_rule_keeps_torchs_large_blocks_within_its_budget():
    """Installed for torch's library: a freed block of 1 MiB or more is kept for the next
    request of its size, at most ``keep`` per size and the budget in all; smaller blocks go
    straight through; a kept block handed out again is a working tensor."""
    library = step_pool._native()
    mib = 1 << 20
    assert library.pool_keep_range(step_pool.TORCH_LIBRARY.encode(), mib, 5 * mib, 4) > 0
    step_pool._installed.add(step_pool.TORCH_LIBRARY)  # (release() in the fixture restores it)
    start = _native_stats()

    small = [torch.ones(1000) for _ in range(10)]  # 4 kB each: never tracked
    del small
    assert _native_stats()[:2] == start[:2]

    floats = (2 * mib) // 4
    blocks = [torch.full((floats,), float(i)) for i in range(3)]  # three 2 MiB blocks
    del blocks  # up to 4 of a size, but two fit the budget of 5 MiB: the third is released
    hits, misses, released, cached = _native_stats()
    assert misses - start[1] == 3 and cached == 2 and released - start[2] == 1

    again = [torch.full((floats,), 7.0) for _ in range(3)]  # two from the pool, one new
    hits, misses, _, cached = _native_stats()
    assert hits - start[0] == 2 and misses - start[1] == 4 and cached == 0
    for t in again:
        assert torch.equal(t, torch.full((floats,), 7.0))
