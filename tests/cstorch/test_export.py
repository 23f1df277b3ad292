"""``cstorch.export``: a GPT training step leaves torch and keeps training in JAX alone.

The exported step runs in a subprocess that cannot import torch (an import hook refuses it)
and must reproduce the original run's losses; a forward step exported with its derivative
becomes the apply function of a flax ``TrainState`` whose optax training lowers the loss.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from tests.models import TinyGPT, lm_loss
from tests.paths import DATA, REPO
from tests.training import linear_mse_batch, sgd_linear_mse_step

pytestmark = pytest.mark.core

VOCAB, SEQ, BATCH = 32, 8, 4

# Prepended to every subprocess script: torch (and the torch-facing packages) cannot load.
NO_TORCH = textwrap.dedent("""
    import sys
    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "cstorch", "cerebras"):
                raise ImportError(f"this process must not import {name}")
    sys.meta_path.insert(0, _NoTorch())
""")


def _x64():
    """JAX's 64-bit types for a block, as the user turns them on (``jax.enable_x64`` from JAX
    0.8; ``jax.experimental.enable_x64`` before, the compat leg's JAX 0.7)."""
    import jax

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64

    return enable_x64(True)


def _run_without_torch(artifact, body, tmp_path):
    script = tmp_path / "torch_free.py"
    script.write_text(
        NO_TORCH
        + textwrap.dedent(f"""
        sys.path.insert(0, {str(artifact)!r})
        import numpy as np
        import exported_step
    """)
        + textwrap.dedent(body)
        + "\nassert 'torch' not in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        tokens = (torch.randint(0, VOCAB, (BATCH, 1), generator=g) + torch.arange(SEQ + 1)) % VOCAB
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


def _gpt_training(model):
    """An AdamW + cosine-decay GPT step with a loss closure, in the example's style."""
    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = cstorch.optim.lr_scheduler.CosineDecayLR(
        optimizer, initial_learning_rate=3e-3, end_learning_rate=3e-4, total_iters=20
    )
    losses = []

    @cstorch.step_closure
    def log(loss):
        losses.append(loss.item())

    @cstorch.trace
    def training_step(inputs, targets):
        loss = lm_loss(compiled(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        log(loss)
        return loss

    return training_step, losses


def _run(step, batches):
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: batches), num_steps=len(batches)
    )
    for inputs, targets in executor:
        step(inputs, targets)


@pytest.mark.slow
def test_exported_gpt_step_trains_without_torch(tmp_path):
    torch.manual_seed(0)
    training_step, losses = _gpt_training(TinyGPT(VOCAB, 32, 2, 2, SEQ))
    batches = _batches(13)
    _run(training_step, batches[:3])
    artifact = cstorch.export(training_step, batches[3], str(tmp_path / "gpt"))
    _run(training_step, batches[3:])  # the original run goes on: its losses are the oracle
    expected = losses[3:]
    assert len(expected) == 10

    manifest = json.loads((tmp_path / "gpt" / "manifest.json").read_text())
    assert manifest["closure_values"] == [{"name": "log.loss", "index": 1}]
    assert {"param", "optimizer", "scheduler"} <= {s["kind"] for s in manifest["state"]}
    np.savez(
        tmp_path / "batches.npz",
        **{f"{i}_{j}": t.numpy() for i, b in enumerate(batches[3:]) for j, t in enumerate(b)},
    )
    losses_there = _run_without_torch(
        artifact,
        """
        import json
        step = exported_step.load(sys.argv[0].rsplit("/", 1)[0] + "/gpt")
        data = np.load("batches.npz")
        print(json.dumps([float(step(data[f"{i}_0"], data[f"{i}_1"])) for i in range(10)]))
    """,
        tmp_path,
    )
    np.testing.assert_allclose(losses_there, expected, rtol=1e-6)


@pytest.mark.slow
def test_flax_train_state_continues_from_exported_forward(tmp_path):
    """The exported forward (with its VJP) as a flax TrainState's apply function: optax AdamW
    keeps lowering the loss from where cstorch left it; orbax saves and restores the state."""
    torch.manual_seed(0)
    model = TinyGPT(VOCAB, 32, 2, 1, SEQ)
    training_step, losses = _gpt_training(model)
    batches = _batches(4)
    _run(training_step, batches)

    @cstorch.trace
    def loss_step(inputs, targets):
        return lm_loss(model(inputs), targets)

    inputs, targets = batches[0]
    start = float(loss_step(inputs, targets))
    artifact = cstorch.export(loss_step, (inputs, targets), str(tmp_path / "forward"), vjp_order=1)
    np.savez(tmp_path / "batch.npz", inputs=inputs.numpy(), targets=targets.numpy())
    result = _run_without_torch(
        artifact,
        """
        import json
        import jax, optax
        import orbax.checkpoint as ocp
        from flax.training import train_state
        forward = exported_step.load(sys.argv[0].rsplit("/", 1)[0] + "/forward")
        batch = np.load("batch.npz")
        inputs, targets = batch["inputs"], batch["targets"]
        params = forward.params()
        frozen = {k: v for k, v in forward.state.items() if k not in params}

        def apply_fn(params, inputs, targets):
            return forward.pure({**frozen, **params}, [inputs, targets])[1]

        # The step takes int64 tokens: a jit of it needs JAX's 64-bit types, which loading
        # the artifact does not turn on for the process. Without them: a clear error.
        try:
            jax.jit(apply_fn)(params, inputs, targets)
            refused = False
        except exported_step.ExportError as error:
            refused = "jax_enable_x64" in str(error)
        jax.config.update("jax_enable_x64", True)
        state = train_state.TrainState.create(apply_fn=apply_fn, params=params,
                                              tx=optax.adamw(1e-2))

        @jax.jit
        def train(state):
            loss, grads = jax.value_and_grad(state.apply_fn)(state.params, inputs, targets)
            return state.apply_gradients(grads=grads), loss

        losses = []
        for _ in range(15):
            state, loss = train(state)
            losses.append(float(loss))
        import os
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(os.path.abspath("ckpt"), state.params)
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(os.path.abspath("ckpt"), state.params)
        same = all(bool((restored[k] == state.params[k]).all()) for k in state.params)
        print(json.dumps({"losses": losses, "restored": same, "n_params": len(params),
                          "refused": refused}))
    """,
        tmp_path,
    )
    assert result["restored"] and result["refused"]
    assert result["n_params"] == len(list(model.parameters()))
    first, *rest = result["losses"]
    assert first == pytest.approx(start, rel=1e-6)  # the exported forward is cstorch's
    assert all(b < a for a, b in zip(result["losses"], rest)), result["losses"]
    assert rest[-1] < 0.8 * first


def test_export_before_the_first_step_takes_the_state_as_it_is(tmp_path):
    # No step has run: export compiles the step without running it, so the exported state is
    # the initial one and the exported step's losses are the cstorch step's, from the start.
    model, training_step = sgd_linear_mse_step()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    artifact = cstorch.export(training_step, linear_mse_batch(0), str(tmp_path / "step"))
    assert all(torch.equal(v, initial[k]) for k, v in model.state_dict().items())
    assert training_step.trace_count == 1
    cstorch_losses = [float(training_step(*linear_mse_batch(i))) for i in range(3)]
    assert training_step.trace_count == 1  # the export's program is the one that ran

    sys.path.insert(0, artifact)
    try:
        import exported_step

        step = exported_step.load(artifact)
    finally:
        sys.path.remove(artifact)
        sys.modules.pop("exported_step", None)
    np.testing.assert_array_equal(
        np.asarray(step.state["model0.weight"]), initial["weight"].numpy()
    )
    state0 = step.state
    x, y = (t.numpy() for t in linear_mse_batch(0))
    loss = step(x, y)  # one training step; step.state holds the new state
    new_state, same_loss = step.pure(state0, [x, y])  # the same step as a pure function
    assert float(loss) == float(same_loss) == pytest.approx(cstorch_losses[0], rel=1e-6)
    for name in new_state:
        np.testing.assert_array_equal(np.asarray(new_state[name]), np.asarray(step.state[name]))
    more = [float(step(*(t.numpy() for t in linear_mse_batch(i)))) for i in (1, 2)]
    np.testing.assert_allclose(more, cstorch_losses[1:], rtol=1e-6)


def test_pure_function_comes_with_its_state(tmp_path):
    import jax

    _, training_step = sgd_linear_mse_step()
    training_step(*linear_mse_batch(0))
    state = training_step.pure_state()
    assert "model0.weight" in state.donated_names
    assert any(n.startswith("optimizer0.state.") for n in state.donated_names)
    f = jax.jit(training_step.pure_function())
    pure_losses = []
    for i in (1, 2, 3):
        new_state, outputs = f(
            state.donated, state.kept, [t.numpy() for t in linear_mse_batch(i)], 0
        )
        state = state.advance(new_state)
        pure_losses.append(float(outputs[0]))
    # The pure loop left cstorch's state alone: the same steps in cstorch give the same losses.
    cstorch_losses = [float(training_step(*linear_mse_batch(i))) for i in (1, 2, 3)]
    np.testing.assert_allclose(pure_losses, cstorch_losses, rtol=1e-6)
    with pytest.raises(ValueError, match="new_state has 1 arrays"):
        state.advance([new_state[0]])


def _torch_momentum_step():
    """A linear model trained by torch's SGD (momentum): (model, optimizer, traced step)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @cstorch.trace
    def training_step(x, y):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return model, optimizer, training_step


def test_a_torch_optimizers_learning_rate_is_exported_state_set_from_jax(tmp_path):
    """The floats a compiled step reads at every call (a torch optimizer's lr) are exported
    state: the exported step reads them from its state at every call, so JAX code schedules
    them there, with the cstorch step's numbers."""
    _, optimizer, training_step = _torch_momentum_step()
    training_step(*linear_mse_batch(0))  # its momentum buffers exist
    artifact = cstorch.export(training_step, linear_mse_batch(1), str(tmp_path / "step"))
    sys.path.insert(0, artifact)
    try:
        import exported_step

        step = exported_step.load(artifact)
    finally:
        sys.path.remove(artifact)
        sys.modules.pop("exported_step", None)
    assert step.kinds["optimizer0.group.0.lr"] == "hyperparameter"
    assert float(step.state["optimizer0.group.0.lr"]) == 0.1
    exported, compiled = [], []
    for i, lr in zip((1, 2, 3), (0.1, 0.05, 0.02)):
        step.state["optimizer0.group.0.lr"] = np.float64(lr)
        exported.append(float(step(*(t.numpy() for t in linear_mse_batch(i)))))
        optimizer.param_groups[0]["lr"] = lr
        compiled.append(float(training_step(*linear_mse_batch(i))))
    np.testing.assert_allclose(exported, compiled, rtol=1e-6)


def test_pure_function_takes_a_torch_optimizers_floats_after_the_batch():
    import jax

    model, optimizer, training_step = _torch_momentum_step()
    training_step(*linear_mse_batch(0))
    state = training_step.pure_state()
    assert state.hyperparameter_names == ["optimizer0.group.0.lr", "optimizer0.group.0.momentum"]
    assert state.hyperparameters == [0.1, 0.9]
    f = jax.jit(training_step.pure_function())
    batch = [t.numpy() for t in linear_mse_batch(1)]
    weight = state.donated_names.index("model0.weight")
    new = {}
    with _x64():
        for lr, inputs in ((0.1, batch), (0.05, batch + [0.05, 0.9])):  # now's values, given
            new_state, _ = f(state.donated, state.kept, inputs, 0)
            new[lr] = np.asarray(state.advance(new_state).donated[weight])
    assert not np.allclose(new[0.1], new[0.05])
    optimizer.param_groups[0]["lr"] = 0.05
    training_step(*linear_mse_batch(1))
    np.testing.assert_allclose(new[0.05], model.weight.detach().numpy(), rtol=1e-6)


# ------------------------------------------------------------------------------ errors
def test_export_errors(tmp_path):
    cstorch.backend("CPU")
    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model)

    @cstorch.trace
    def step(x):
        return compiled(x).sum()

    with pytest.raises(TypeError, match="example batch of tensors"):
        cstorch.export(step, 3, str(tmp_path / "a"))
    with pytest.raises(TypeError, match="@cstorch.trace"):
        cstorch.export(lambda x: x, torch.ones(3, 2), str(tmp_path / "a"))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an exported step"):
        cstorch.export(step, torch.ones(3, 2), str(tmp_path / "taken"))
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_export_refuses_the_eager_engine(tmp_path):
    cstorch.backend("CPU", engine="eager")

    @cstorch.trace
    def step(x):
        return x * 2

    step(torch.ones(2))
    with pytest.raises(RuntimeError, match='engine="jax"'):
        cstorch.export(step, torch.ones(2), str(tmp_path / "a"))


def test_loader_checks_artifact_and_inputs(tmp_path):
    from jax_backend import exported

    cstorch.backend("CPU")
    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model)

    @cstorch.trace
    def step(x):
        return compiled(x).sum()

    x = torch.ones(3, 2)
    expected = float(step(x))
    path = cstorch.export(step, x, str(tmp_path / "a"))
    loaded = exported.load(path)
    assert float(loaded(x.numpy())) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match=r"shape \(4, 2\).*exported for \(3, 2\)"):
        loaded(np.ones((4, 2), np.float32))
    with pytest.raises(TypeError, match="takes 1 input arrays, got 2"):
        loaded(x.numpy(), x.numpy())
    with pytest.raises(exported.ExportError, match="no manifest.json"):
        exported.load(str(tmp_path))
    program = tmp_path / "a" / "step.jaxexport"
    intact = program.read_bytes()
    program.write_bytes(intact[: len(intact) // 2])
    with pytest.raises(exported.ExportError, match="damaged"):
        exported.load(path)
    program.write_bytes(intact)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    manifest["version"] = 99
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(exported.ExportError, match="version 99"):
        exported.load(path)


# ------------------------------------------------------------------- what made a step
OLD_ARTIFACT = os.path.join(DATA, "export_jax_0_7_0")  # written by tests/data/make_old_export.py


def test_the_manifest_says_what_made_the_step(tmp_path):
    import importlib.metadata
    import tomllib

    import jax

    _, training_step = sgd_linear_mse_step()
    path = cstorch.export(training_step, linear_mse_batch(0), str(tmp_path / "step"))
    made_by = json.loads((tmp_path / "step" / "manifest.json").read_text())["made_by"]
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]["version"]
    assert made_by["jax"] == jax.__version__
    assert made_by["jaxlib"] == importlib.metadata.version("jaxlib")
    assert made_by["cstorch_jax"] == project
    from jax_backend import exported

    loaded = exported.load(path)
    assert made_by["calling_convention_version"] == loaded.exported.calling_convention_version
    assert isinstance(made_by["jax_export_serialization_version"], int)
    assert made_by["jax_export_serialization_version"] >= 2
    assert isinstance(made_by["stablehlo_version"], str)
    assert made_by["stablehlo_version"].count(".") == 2


def _old_batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 3, generator=g).numpy(), torch.randn(4, 2, generator=g).numpy()


def test_a_step_exported_by_jax_0_7_runs_or_names_the_versions_that_cannot_read_it():
    """JAX 0.7.0 wrote this artifact (jax.export serialization version 2). JAX up to 0.11
    reads it and trains on with the losses cstorch had; JAX 0.12 refuses it unless its
    ``jax_export_deserialize_expired_versions`` flag is on: the loader then says which JAX
    wrote it, which cannot read it, and how to export again."""
    import jax

    from jax_backend import exported

    with open(os.path.join(OLD_ARTIFACT, "expected.json")) as f:
        expected = json.load(f)["losses"]
    flag = "jax_export_deserialize_expired_versions"  # JAX 0.12 and later
    if flag in jax.config.values:
        with pytest.raises(exported.ExportVersionError) as info:
            exported.load(OLD_ARTIFACT)
        message = str(info.value)
        for words in (
            "JAX 0.7.0",
            "jaxlib 0.7.0",
            "serialization version 2",
            f"the installed JAX {jax.__version__}",
            "cstorch.export(",
            "pip install 'jax==0.7.0' 'jaxlib==0.7.0'",
            "JAX_EXPORT_DESERIALIZE_EXPIRED_VERSIONS=1",
        ):
            assert words in message, (words, message)
        previous = jax.config.values[flag]
        jax.config.update(flag, True)
        try:
            with pytest.warns(DeprecationWarning, match="compatibility window"):
                step = exported.load(OLD_ARTIFACT)
        finally:
            jax.config.update(flag, previous)
    else:
        step = exported.load(OLD_ARTIFACT)
    losses = [float(step(*_old_batch(i))) for i in range(3)]
    np.testing.assert_allclose(losses, expected, rtol=1e-6)


def test_an_unreadable_program_error_names_both_versions(tmp_path, monkeypatch):
    """On any JAX: a program JAX refuses for its version is an ExportVersionError naming the
    writer (from the manifest, or only its JAX for artifacts older than ``made_by``); a
    program the same JAX wrote and cannot decode is damage."""
    import shutil

    import jax

    from jax_backend import exported

    artifact = tmp_path / "old"
    shutil.copytree(OLD_ARTIFACT, artifact)

    def refuse(blob):
        raise ValueError(
            "Exported being deserialized seems to be older than the 6-month "
            "backward-compatibility window"
        )

    monkeypatch.setattr(jax.export, "deserialize", refuse)
    with pytest.raises(
        exported.ExportVersionError,
        match=r"written by JAX 0\.7\.0 \(jaxlib "
        r"0\.7\.0, jax\.export serialization version 2, calling convention "
        r"\d+, StableHLO [\d.]+\) for cstorch-jax",
    ):
        exported.load(str(artifact))
    manifest = json.loads((artifact / "manifest.json").read_text())
    del manifest["made_by"]  # as cstorch wrote it before it recorded more than its JAX
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        exported.ExportVersionError,
        match=r"written by JAX 0\.7\.0; the "
        rf"installed JAX {re.escape(jax.__version__)}",
    ):
        exported.load(str(artifact))
    manifest["jax_version"] = jax.__version__  # this very JAX wrote it: damage, not age

    def garbled(blob):
        raise IndexError("unpack_from requires a buffer of at least 4 bytes")

    (artifact / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(jax.export, "deserialize", garbled)
    with pytest.raises(exported.ExportError, match="damaged") as info:
        exported.load(str(artifact))
    assert not isinstance(info.value, exported.ExportVersionError)


@pytest.mark.parametrize("field", ["jax", "jaxlib", "stablehlo_version"])
def test_a_manifest_cannot_make_a_long_version_error(tmp_path, monkeypatch, field):
    """The manifest is a foreign file: its ``made_by`` strings are quoted by a short prefix,
    so a 50 MB string there makes an error of a few hundred characters (it was repeated in
    full, twice: a 100-million-character message) (issue 49, item 4)."""
    import shutil

    import jax

    from jax_backend import exported

    artifact = tmp_path / "old"
    shutil.copytree(OLD_ARTIFACT, artifact)
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["made_by"][field] = "9" + "x" * 50_000_000
    (artifact / "manifest.json").write_text(json.dumps(manifest))

    def refuse(blob):
        raise ValueError(
            "Exported being deserialized seems to be older than the 6-month "
            "backward-compatibility window"
        )

    monkeypatch.setattr(jax.export, "deserialize", refuse)
    with pytest.raises(exported.ExportVersionError) as info:
        exported.load(str(artifact))
    message = str(info.value)
    assert len(message) < 1500, len(message)
    assert "'9xxxxxxxx" in message and "... (50000001 characters)" in message


@pytest.mark.parametrize("edit", ["name", "dtype", "missing"])
def test_state_names_from_a_manifest_are_quoted_short(tmp_path, edit):
    """A state entry's name or dtype, as long as the manifest makes it, appears in the load's
    error by a short prefix."""
    from jax_backend import exported

    _, training_step = sgd_linear_mse_step()
    path = cstorch.export(training_step, linear_mse_batch(0), str(tmp_path / "step"))
    manifest = json.loads((tmp_path / "step" / "manifest.json").read_text())
    long = "w" * 5_000_000
    if edit == "name":  # the name of a member that is not in state.npz
        manifest["state"].append({**manifest["state"][0], "name": long})
    elif edit == "dtype":
        manifest["state"][0]["dtype"] = long
    else:
        manifest["used"].append(long)
    (tmp_path / "step" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(exported.ExportError) as info:
        exported.load(path)
    assert len(str(info.value)) < 1000, str(info.value)[:300]
    assert "'wwwww" in str(info.value)


def test_a_cpu_sparsity_step_with_host_topk_is_refused_clearly(tmp_path):
    """On CPU, GMP's mask updates call torch.topk on the host (the reference's tie order),
    which jax.export cannot serialize: the export says so and what to do, and leaves
    nothing behind."""
    from cerebras.pytorch import sparse

    backend = cstorch.backend("CPU")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    sparsity = sparse.GMP(
        sparsity={"type": "linear", "init": 0.0, "slope": 0.1},
        update={"freq": 2},
        init_method="topk",
    )
    model.apply(sparsity)
    optimizer.apply(sparsity)

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    x, y = torch.randn(4, 6), torch.tensor([0, 1, 1, 0])
    assert np.isfinite(float(step(x, y)))
    with pytest.raises(NotImplementedError, match="calls back into Python on the host"):
        cstorch.export(step, (x, y), str(tmp_path / "gmp"))
    assert not (tmp_path / "gmp").exists()
    assert os.listdir(tmp_path) == []  # no staging directory left either


def _bn_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )


@pytest.mark.slow
def test_a_forward_export_trains_batchnorm_in_jax_and_comes_back_to_torch(tmp_path):
    """Issue 31: ``apply`` returns the loss with the new buffers, so BatchNorm's running
    statistics follow training in a JAX loop (the README's old ``pure(...)[1]`` left them at
    their exported values), and ``cstorch.torch_state_dict`` brings the JAX-trained state back
    into torch under its own names. Oracle: the same 3 SGD steps in eager torch."""
    import copy

    import jax
    import optax

    from jax_backend import exported

    model = _bn_model()
    reference = copy.deepcopy(model)
    compiled = cstorch.compile(model, cstorch.backend("CPU"))

    @cstorch.trace
    def loss_step(x, y):  # forward only: the loss, no backward, no optimizer
        return torch.nn.functional.mse_loss(compiled(x), y)

    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)) for _ in range(3)]
    artifact = cstorch.export(loss_step, batches[0], str(tmp_path / "forward"), vjp_order=1)
    step = exported.load(artifact)
    params, buffers = step.params(), step.buffers()
    assert set(buffers) == {
        "model0.1.running_mean",
        "model0.1.running_var",
        "model0.1.num_batches_tracked",
    }
    tx = optax.sgd(0.1)
    opt_state = tx.init(params)

    def train(params, buffers, opt_state, x, y):
        (loss, buffers), grads = jax.value_and_grad(step.apply, has_aux=True)(
            params, buffers, [x, y]
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), buffers, opt_state, loss

    losses = []
    with _x64():  # num_batches_tracked is int64
        train = jax.jit(train)
        for x, y in batches:
            params, buffers, opt_state, loss = train(
                params, buffers, opt_state, x.numpy(), y.numpy()
            )
            losses.append(float(loss))

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    eager_losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(reference(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        eager_losses.append(loss.item())
    assert losses == pytest.approx(eager_losses, rel=1e-5)

    restored = _bn_model()
    restored.load_state_dict(cstorch.torch_state_dict({**params, **buffers}))  # strict names
    expected = reference.state_dict()
    for name, tensor in restored.state_dict().items():
        assert tensor.dtype == expected[name].dtype, name
        torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-6)
    assert int(restored[1].num_batches_tracked) == 3
    assert not torch.equal(restored[1].running_mean, model[1].running_mean)  # they moved
    cstorch.save(restored.state_dict(), str(tmp_path / "from_jax.mdl"))
    loaded = cstorch.load(str(tmp_path / "from_jax.mdl"))
    torch.testing.assert_close(loaded["3.weight"], expected["3.weight"], rtol=1e-5, atol=1e-6)


def test_apply_refuses_a_training_step_and_unknown_parameters(tmp_path):
    from jax_backend import exported

    model, training_step = sgd_linear_mse_step()
    x, y = linear_mse_batch(0)
    step = exported.load(cstorch.export(training_step, (x, y), str(tmp_path / "train")))
    with pytest.raises(exported.ExportError, match="forward-only step.*model0.weight"):
        step.apply(step.params(), step.buffers(), [x.numpy(), y.numpy()])

    @cstorch.trace
    def loss_step(x, y):
        return torch.nn.functional.mse_loss(model(x), y)

    forward = exported.load(cstorch.export(loss_step, (x, y), str(tmp_path / "forward")))
    loss, buffers = forward.apply(forward.params(), forward.buffers(), [x.numpy(), y.numpy()])
    with torch.no_grad():
        expected = float(torch.nn.functional.mse_loss(model(x), y))
    assert float(loss) == pytest.approx(expected)
    with pytest.raises(exported.ExportError, match=r"does not have: \['weight'\].*model0"):
        forward.apply(
            {"weight": forward.params()["model0.weight"]}, buffers, [x.numpy(), y.numpy()]
        )


def test_torch_state_dict_names_and_dtypes():
    import jax.numpy as jnp

    state = {
        "model0.fc.weight": jnp.ones((2, 3), jnp.bfloat16),
        "model0.bn.num_batches_tracked": np.array(4, np.int64),
        "model1.other.weight": np.zeros(2, np.float32),
        "optimizer0.state.0.exp_avg": np.zeros((2, 3), np.float32),
    }
    result = cstorch.torch_state_dict(state)
    assert set(result) == {"fc.weight", "bn.num_batches_tracked"}
    assert result["fc.weight"].dtype == torch.bfloat16 and result["fc.weight"].sum() == 6
    assert result["bn.num_batches_tracked"].dtype == torch.int64
    assert set(cstorch.torch_state_dict(state, model=1)) == {"other.weight"}
    with pytest.raises(ValueError, match="no state of model 2.*model0, model1"):
        cstorch.torch_state_dict(state, model=2)


def test_torch_state_dict_finds_a_compiled_models_index(cpu_backend):
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(3, 1)
    cstorch.compile(first, cpu_backend)
    cstorch.compile(second, cpu_backend)
    state = {
        "model0.weight": np.zeros((2, 2), np.float32),
        "model1.weight": np.ones((1, 3), np.float32),
    }
    assert cstorch.torch_state_dict(state, second)["weight"].shape == (1, 3)
    with pytest.raises(ValueError, match="not compiled with cstorch.compile"):
        cstorch.torch_state_dict(state, torch.nn.Linear(3, 1))
