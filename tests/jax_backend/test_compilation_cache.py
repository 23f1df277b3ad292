"""JAX's persistent compilation cache: a second run of an unchanged script compiles nothing,
and any change to the step function, the model or an input shape compiles afresh (no stale
program ever runs: the losses are checked against eager torch every time)."""

import json
import os
import sys
import textwrap

import pytest

from tests import fork_server
from tests.paths import REPO as ROOT

pytestmark = pytest.mark.slow  # fresh Python processes


# Every script counts the persistent cache's hits and misses in its process, and reads the
# model's width, the batch and a loss scale from its arguments.
COUNTING = textwrap.dedent("""
    import json, sys
    import jax.monitoring
    counts = {"hits": 0, "misses": 0}
    def on_event(event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1
        elif event == "/jax/compilation_cache/cache_misses":
            counts["misses"] += 1
    jax.monitoring.register_event_listener(on_event)

    import torch
    import cerebras.pytorch as cstorch
    from tests.training import minimizing

    width, batch, scale = (int(a) for a in sys.argv[1:4])
""")

SCRIPT = COUNTING + textwrap.dedent("""
    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(),
                                   torch.nn.Linear(width, 3))

    x = torch.randn(batch, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (batch,), generator=torch.Generator().manual_seed(2))

    reference = build()                       # eager torch, the independent oracle
    eager_loss = torch.nn.functional.cross_entropy(reference(x), y) * scale

    model = build()
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    step = cstorch.trace(
        minimizing(lambda x, y: torch.nn.functional.cross_entropy(compiled(x), y) * scale,
                   optimizer))

    loss = step(x, y).item()
    print("RESULT " + json.dumps({**counts, "loss": loss, "eager": eager_loss.item()}))
""")

# A model (``build``, of ``width``) trained three SGD steps at ``lr``, its last loss against
# eager torch's (under torch.autocast in bfloat16 where ``half``, and then cstorch's bfloat16
# policy); "marked": whether the step's program names ``marker``.
THREE_STEPS = textwrap.dedent("""
    STEPS = 3

    def objective(out, y):
        return torch.nn.functional.cross_entropy(out, y) * scale

    x = torch.randn(batch, {features}, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (batch,), generator=torch.Generator().manual_seed(2))

    reference = build()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr={lr})

    def eager_objective(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled={half}):
            return objective(reference(x), y)

    eager_step = minimizing(eager_objective, reference_optimizer)
    for _ in range(STEPS):
        eager_loss = eager_step(x, y)

    if {half}:
        cstorch.amp.set_half_dtype("bfloat16")
    model = build()
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr={lr})

    step = cstorch.trace(minimizing(lambda x, y: objective(compiled(x), y), optimizer))

    loss = [step(x, y).item() for _ in range(STEPS)][-1]
    marked = "{marker}" in step.stablehlo()
    print("RESULT " + json.dumps(
        {{**counts, "loss": loss, "eager": eager_loss.item(), "marked": marked}}))
""")

# The MLP of the HALF and OPTIMIZER scripts (``width`` hidden units).
MLP = textwrap.dedent("""
    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(),
                                   torch.nn.Linear(width, 3))
""")

# A bfloat16 MLP: "marked" says its program calls the engine's layout copy.
HALF_SCRIPT = (
    COUNTING
    + MLP
    + THREE_STEPS.format(features="8", lr=0.5, half=True, marker="cstorch_swap_last_two")
)

# A small float32 CNN (``width`` channels): "marked" says its program calls torch's
# convolution kernels through the engine's FFI library.
CONV_SCRIPT = (
    COUNTING
    + textwrap.dedent("""
        def build():
            torch.manual_seed(0)
            return torch.nn.Sequential(
                torch.nn.Conv2d(2, width, 3), torch.nn.ReLU(), torch.nn.Conv2d(width, 4, 3),
                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))
    """)
    + THREE_STEPS.format(
        features="2, 10, 10", lr=0.1, half=False, marker="cstorch_torch_convolution"
    )
)

# The float32 MLP again (``THREE_STEPS``'s cstorch SGD): "marked" says its program runs the
# update through the engine's fused optimizer library.
OPTIMIZER_SCRIPT = (
    COUNTING
    + MLP
    + THREE_STEPS.format(features="8", lr=0.1, half=False, marker="cstorch_sgd_update")
)

# A float32 MLP with a layer norm: "marked" says its program runs the layer norm through the
# engine's native library.
LAYER_NORM_SCRIPT = (
    COUNTING
    + textwrap.dedent("""
        def build():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.LayerNorm(width),
                                       torch.nn.ReLU(), torch.nn.Linear(width, 3))
    """)
    + THREE_STEPS.format(features="8", lr=0.1, half=False, marker="cstorch_layer_norm")
)


def _run(cache_dir, tmp_path, width, batch, scale, script=SCRIPT, **env_vars):
    env = dict(
        os.environ,
        CSTORCH_COMPILATION_CACHE=str(cache_dir),
        **env_vars,
        PYTHONPATH=os.pathsep.join(
            [ROOT, os.path.join(ROOT, "compat"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    path = tmp_path / "script.py"
    path.write_text(script)
    out = fork_server.run(
        [sys.executable, str(path), str(width), str(batch), str(scale)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(s for s in out.stdout.splitlines() if s.startswith("RESULT "))
    result = json.loads(line[7:])
    assert result["loss"] == pytest.approx(result["eager"], rel=1e-6)
    result["stderr"] = out.stderr
    return result


def _warm_run(cache, tmp_path, cold, *args, **kwargs):
    """``_run(cache, tmp_path, *args, **kwargs)`` again after ``cold``, whose run compiled and
    filled ``cache``: checked to compile nothing, load the step (still calling the engine's
    native code: "marked") and train as the first did."""
    assert cold["misses"] >= 1 and cold["hits"] == 0
    warm = _run(cache, tmp_path, *args, **kwargs)
    assert warm["misses"] == 0 and warm["hits"] >= 1
    assert warm["marked"] and warm["loss"] == cold["loss"]
    return warm


@pytest.mark.heavy
def test_second_run_compiles_nothing_and_changes_miss(tmp_path):
    cache = tmp_path / "cache"
    cold = _run(cache, tmp_path, width=16, batch=4, scale=1)
    assert cold["misses"] >= 1 and cold["hits"] == 0
    assert any(name.startswith("jit_pure_step") for name in os.listdir(cache))

    warm = _run(cache, tmp_path, width=16, batch=4, scale=1)
    assert warm["misses"] == 0 and warm["hits"] >= 1
    assert warm["loss"] == cold["loss"]

    # Each change must compile a new step program; the losses above prove no stale one ran.
    assert _run(cache, tmp_path, width=16, batch=4, scale=2)["misses"] >= 1  # step function
    assert _run(cache, tmp_path, width=24, batch=4, scale=1)["misses"] >= 1  # model
    assert _run(cache, tmp_path, width=16, batch=6, scale=1)["misses"] >= 1  # input shape


def test_a_changed_cpu_step_memory_compiles_afresh(tmp_path):
    """The layout's XLA options are part of the cache key: a process with another
    CSTORCH_CPU_STEP_MEMORY never runs the program another choice compiled."""
    cache = tmp_path / "cache"
    lean = _run(cache, tmp_path, 16, 4, 1, CSTORCH_CPU_STEP_MEMORY="lean")
    assert lean["misses"] >= 1 and lean["hits"] == 0
    others = {
        choice: _run(cache, tmp_path, 16, 4, 1, CSTORCH_CPU_STEP_MEMORY=choice)
        for choice in ("xla", "reuse")
    }
    again = _run(cache, tmp_path, 16, 4, 1, CSTORCH_CPU_STEP_MEMORY="lean")
    assert again["misses"] == 0 and again["hits"] >= 1
    for choice, other in others.items():
        # every program but the step came from the cache: the step compiled under its own key
        assert other["hits"] == again["hits"] - 1, choice
        assert other["loss"] == lean["loss"]
    assert others["xla"]["misses"] >= 1  # written (JAX counts a write as a miss)
    assert others["reuse"]["misses"] == 0  # reuse steps are never written (test below)


def test_a_bf16_step_with_the_layout_copy_is_cached_and_a_changed_setting_compiles_afresh(
    tmp_path,
):
    """The engine's layout copy (``cpu_half_dots="native"``) is an FFI custom call, which JAX
    keeps in the persistent cache (a host callback it never writes): a second process loads
    the bf16 step and trains as the first did, as eager autocast does; a process with
    CSTORCH_CPU_HALF_DOTS=xla compiles its own step (the setting changes the program, so the
    key) and never runs the cached one."""
    cache = tmp_path / "cache"
    cold = _run(cache, tmp_path, 16, 32, 1, script=HALF_SCRIPT)
    if not cold["marked"]:
        pytest.skip("this jaxlib's XLA widens every bf16 dot: native runs as torch (callbacks)")
    warm = _warm_run(cache, tmp_path, cold, 16, 32, 1, script=HALF_SCRIPT)
    widened = _run(cache, tmp_path, 16, 32, 1, script=HALF_SCRIPT, CSTORCH_CPU_HALF_DOTS="xla")
    assert not widened["marked"]
    assert widened["hits"] == warm["hits"] - 1  # every program but the step from the cache
    assert widened["misses"] >= 1


def test_a_step_with_native_convolutions_is_cached_and_a_changed_setting_compiles_afresh(
    tmp_path,
):
    """torch's convolution kernels through the engine's FFI library (``cpu_convolutions=
    "native"``) make a program JAX keeps in the persistent cache (the host callbacks of
    ``"torch"`` it never writes): a second process loads the CNN's step, registers the custom
    calls it names and trains as the first did, as eager torch does; a process with another
    setting compiles its own step and never runs the cached one."""
    cache = tmp_path / "cache"
    cold = _run(cache, tmp_path, 8, 4, 1, script=CONV_SCRIPT)
    assert cold["marked"]
    warm = _warm_run(cache, tmp_path, cold, 8, 4, 1, script=CONV_SCRIPT)
    for other in ("torch", "xla"):
        run = _run(cache, tmp_path, 8, 4, 1, script=CONV_SCRIPT, CSTORCH_CPU_CONVOLUTIONS=other)
        assert not run["marked"], other
        assert run["hits"] == warm["hits"] - 1, other  # every program but the step
    # the callbacks' step is never written, XLA's is: a second "xla" process loads it
    again = _run(cache, tmp_path, 8, 4, 1, script=CONV_SCRIPT, CSTORCH_CPU_CONVOLUTIONS="xla")
    assert again["misses"] == 0


def test_a_step_with_the_fused_optimizer_is_cached_and_a_changed_setting_compiles_afresh(
    tmp_path,
):
    """The fused optimizer update (``cpu_optimizer="native"``) is an FFI custom call JAX keeps
    in the persistent cache: a second process loads the step, registers the library's targets
    and trains as the first did (as eager torch does); a process with
    CSTORCH_CPU_OPTIMIZER=xla compiles its own step and never runs the cached one."""
    cache = tmp_path / "cache"
    cold = _run(cache, tmp_path, 16, 8, 1, script=OPTIMIZER_SCRIPT)
    assert cold["marked"]
    warm = _warm_run(cache, tmp_path, cold, 16, 8, 1, script=OPTIMIZER_SCRIPT)
    xla = _run(cache, tmp_path, 16, 8, 1, script=OPTIMIZER_SCRIPT, CSTORCH_CPU_OPTIMIZER="xla")
    assert not xla["marked"]
    assert xla["hits"] == warm["hits"] - 1  # every program but the step
    assert xla["misses"] >= 1


def test_a_step_with_the_native_layer_norm_is_cached_and_a_changed_setting_compiles_afresh(
    tmp_path,
):
    """The native layer norm (``cpu_layer_norm="native"``) is an FFI custom call JAX keeps in
    the persistent cache: a second process loads the step, registers the library's targets and
    trains as the first did; CSTORCH_CPU_LAYER_NORM=xla compiles its own step."""
    cache = tmp_path / "cache"
    cold = _run(cache, tmp_path, 16, 8, 1, script=LAYER_NORM_SCRIPT)
    assert cold["marked"]
    assert abs(cold["loss"] - cold["eager"]) <= 1e-5 * abs(cold["eager"])
    warm = _warm_run(cache, tmp_path, cold, 16, 8, 1, script=LAYER_NORM_SCRIPT)
    xla = _run(cache, tmp_path, 16, 8, 1, script=LAYER_NORM_SCRIPT, CSTORCH_CPU_LAYER_NORM="xla")
    assert not xla["marked"]
    assert xla["hits"] == warm["hits"] - 1  # every program but the step
    assert xla["misses"] >= 1


@pytest.mark.heavy
def test_a_reuse_step_with_several_heaps_is_not_written_and_not_warned_about(tmp_path):
    """With ``reuse``, a step whose temporaries exceed one heap (here 4096x4096 f32 hidden
    activations, 64 MiB) compiles to an executable XLA cannot serialize; JAX warned on every
    run that writing it failed. It is not written at all; a ``lean`` step still is."""
    cache = tmp_path / "cache"
    reuse = _run(cache, tmp_path, 4096, 4096, 1, CSTORCH_CPU_STEP_MEMORY="reuse")
    assert "compilation cache" not in reuse["stderr"], reuse["stderr"][-2000:]
    steps = (
        [n for n in os.listdir(cache) if n.startswith("jit_pure_step")] if cache.exists() else []
    )
    assert steps == []
    lean = _run(cache, tmp_path, 4096, 4096, 1, CSTORCH_CPU_STEP_MEMORY="lean")
    assert lean["loss"] == reuse["loss"]
    assert any(n.startswith("jit_pure_step") for n in os.listdir(cache))


def test_cache_can_be_switched_off(tmp_path, monkeypatch):
    from jax_backend import compilation_cache

    monkeypatch.setenv(compilation_cache.ENV_VAR, "off")
    assert compilation_cache.default_directory() is None
    monkeypatch.setenv(compilation_cache.ENV_VAR, str(tmp_path / "c"))
    assert compilation_cache.default_directory() == str(tmp_path / "c")
    monkeypatch.delenv(compilation_cache.ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compilation_cache.default_directory() == str(tmp_path / "cstorch-jax" / "xla")
