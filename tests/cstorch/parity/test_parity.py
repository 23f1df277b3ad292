"""The eager engine and ``python -m cstorch.parity``.

The eager engine must be plain eager torch: its losses equal a hand-written torch loop with an
independent AdamW (tests/eager_reference.py). The parity command must pass a script that
agrees on both engines and fail, naming the step, on one perturbed from a known step.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from cstorch.core.engine import resolve_engine
from cstorch.parity import runner
from cstorch.parity.compare import (
    compare_closures,
    compare_state,
    first_divergence,
    relative_difference,
    within,
)
from tests import eager_reference as ref, fork_server
from tests.paths import DATA, REPO
from tests.training import lr_recording_step

pytestmark = pytest.mark.core

FIXTURE = os.path.join(DATA, "parity", "tiny_train.py")


@pytest.fixture(autouse=True)
def _engines_forked(monkeypatch):
    """The parity tool's engines start as children of the tests' fork server."""
    monkeypatch.setattr(runner, "subprocess", fork_server.subprocess_module())


def _train(engine, steps=5, lr=1e-2):
    """The fixture's loop in-process; returns (losses from the closure, final params, step)."""
    torch.manual_seed(0)
    backend = cstorch.backend("CPU", engine=engine)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses = []

    @cstorch.step_closure
    def record(loss):
        losses.append(loss.item())

    @cstorch.trace
    def training_step(inputs, targets):
        loss = F.cross_entropy(compiled(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record(loss)
        return loss

    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g))
        for _ in range(steps)
    ]
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: batches), num_steps=steps
    )
    for inputs, targets in executor:
        training_step(inputs, targets)
    return losses, {k: v.clone() for k, v in model.state_dict().items()}, training_step, batches


def _eager_torch_reference(batches, lr=1e-2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    optimizer = ref.EagerCstorchAdamW(model.parameters(), eps=1e-6, weight_decay=0.01)
    losses = []
    for inputs, targets in batches:
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step(lr)
        losses.append(loss.item())
    return losses, model.state_dict()


@pytest.mark.slow
def test_eager_engine_is_eager_torch():
    losses, params, step, batches = _train("eager")
    assert step.trace_count == 0  # nothing was captured or compiled
    expected, expected_params = _eager_torch_reference(batches)
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    for name, value in expected_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_eager_and_jax_engines_agree():
    eager_losses, eager_params, _, _ = _train("eager")
    cstorch.backend._reset_for_tests()
    jax_losses, jax_params, step, _ = _train("jax")
    assert step.trace_count == 1
    np.testing.assert_allclose(jax_losses, eager_losses, rtol=1e-5)
    for name, value in eager_params.items():
        torch.testing.assert_close(jax_params[name], value, rtol=1e-4, atol=1e-6)


def _warmup_cosine_lrs(engine, steps=20):
    """The learning rate a step closure sees at each of ``steps`` steps of a linear warmup
    then cosine decay, on ``engine``."""
    torch.manual_seed(0)
    backend = cstorch.backend("CPU", engine=engine)
    model = torch.nn.Linear(4, 2)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=3e-3)
    lr_scheduler = cstorch.optim.lr_scheduler
    scheduler = lr_scheduler.SequentialLR(
        optimizer,
        [
            lr_scheduler.LinearLR(
                optimizer, initial_learning_rate=0.0, end_learning_rate=3e-3, total_iters=7
            ),
            lr_scheduler.CosineDecayLR(
                optimizer, initial_learning_rate=3e-3, end_learning_rate=3e-4, total_iters=13
            ),
        ],
        milestones=[7],
    )
    training_step, seen = lr_recording_step(compiled, optimizer, scheduler)
    for _ in range(steps):
        training_step(torch.ones(2, 4))
    return seen


def test_a_schedule_gives_both_engines_the_same_learning_rates_bit_for_bit():
    """The eager engine evaluates a cstorch schedule outside any compiled step, the JAX
    engine inside its step program: both compile the schedule as XLA programs, and the rates
    agree to the bit (evaluated op by op, the eager engine's rates were 1-2 units in the last
    place off at some warmup and decay steps)."""
    eager = _warmup_cosine_lrs("eager")
    cstorch.backend._reset_for_tests()
    jax_rates = _warmup_cosine_lrs("jax")
    assert eager == jax_rates
    warmup = [3e-3 * (k + 1) / 7 for k in range(6)]  # torch's LinearLR, in float64
    np.testing.assert_allclose(eager[:6], warmup, rtol=1e-6)
    assert eager[-1] == np.float32(3e-4)


def test_engine_from_environment(monkeypatch):
    monkeypatch.setenv("CSTORCH_ENGINE", "eager")
    assert cstorch.backend("CPU").engine == "eager"
    assert resolve_engine("jax") == "jax"  # an explicit argument wins
    monkeypatch.setenv("CSTORCH_ENGINE", "tpu")
    with pytest.raises(ValueError, match="CSTORCH_ENGINE.*eager"):
        resolve_engine()
    monkeypatch.delenv("CSTORCH_ENGINE")
    assert resolve_engine() == "jax"


def test_unknown_engine_argument_creates_no_backend():
    with pytest.raises(ValueError, match="Unknown engine 'fast'"):
        cstorch.backend("CPU", engine="fast")
    assert cstorch.backend() is None


def test_eager_engine_checkpoint_closure(tmp_path):
    """Checkpoint closures run on the executor's checkpoint steps, as on the JAX engine."""
    backend = cstorch.backend("CPU", engine="eager")
    model = torch.nn.Linear(3, 1)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    saved = []

    @cstorch.checkpoint_closure
    def save(step):
        path = str(tmp_path / f"ckpt_{step}.mdl")
        cstorch.save({"model": model.state_dict()}, path)
        saved.append((step, path, model.weight.detach().clone()))

    @cstorch.trace
    def training_step(x):
        loss = compiled(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    batches = [torch.randn(4, 3) for _ in range(4)]
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: batches), num_steps=4, checkpoint_steps=2
    )
    for step, x in enumerate(executor, start=1):
        training_step(x)
        save(step)
    assert [s for s, _, _ in saved] == [2, 4]
    for _, path, weight in saved:
        torch.testing.assert_close(cstorch.load(path)["model"]["weight"], weight)


# ------------------------------------------------------------------------------ comparison
def test_relative_difference_and_tolerance():
    a, b = np.array([1.0, 0.0, np.nan]), np.array([1.0001, 0.0, np.nan])
    assert relative_difference(a, b) == pytest.approx(1e-4 / 1.0001)
    assert within(a, b, rtol=2e-4, atol=0) and not within(a, b, rtol=5e-5, atol=0)
    assert relative_difference(a, None) == float("inf")
    assert relative_difference(a, np.zeros(2)) == float("inf")  # shape mismatch
    assert not within(np.array(1.0), np.array(np.nan), rtol=1.0, atol=1.0)


def test_missing_value_counts_as_divergence():
    reference = {(1, "log.loss"): np.array(2.0), (2, "log.loss"): np.array(1.5)}
    other = {(1, "log.loss"): np.array(2.0)}
    rows = compare_closures([reference, other], rtol=1e-4, atol=0)
    assert first_divergence(rows, 1).step == 2


def test_compare_state_names_largest_difference():
    a = {"w": np.array([1.0, 2.0]), "b": np.array([10.0])}
    b = {"w": np.array([1.0, 2.2]), "b": np.array([10.0])}
    diff = compare_state(a, b)
    assert diff.name == "w" and diff.max_abs == pytest.approx(0.2)
    assert diff.max_rel == pytest.approx(0.1) and not diff.missing
    assert compare_state(a, {"w": a["w"]}).missing == ["b"]


def test_recorder_names_closure_arguments():
    from cstorch.parity.record import Recorder

    recorder = Recorder()

    def log(loss, metrics, step):
        pass

    wrapped = recorder.wrap(log)
    recorder.step = 3
    wrapped(torch.tensor(2.5), {"acc": torch.tensor([0.5, 1.0])}, step=3)
    wrapped(torch.tensor(1.5), {"acc": torch.tensor([0.0, 1.0])}, step=3)
    assert sorted(recorder.values) == [
        (3, "log.loss"),
        (3, "log.loss#1"),
        (3, "log.metrics['acc']"),
        (3, "log.metrics['acc']#1"),
        (3, "log.step"),
        (3, "log.step#1"),
    ]
    np.testing.assert_array_equal(recorder.values[(3, "log.metrics['acc']#1")], [0.0, 1.0])


def test_recording_serves_every_backend_with_the_engine_under_comparison(tmp_path):
    from cstorch.backend import precision
    from cstorch.distributed import ClusterConfig
    from cstorch.parity.record import serve_every_backend

    serve_every_backend("eager", "cpu", float32=False)
    backend = cstorch.backend(
        "CSX", artifact_dir=str(tmp_path), cluster_config=ClusterConfig(num_csx=1)
    )
    assert backend.is_cpu and backend.engine == "eager" and backend.artifact_dir == str(tmp_path)
    cstorch.backend._reset_for_tests()
    assert cstorch.backend("CPU", engine="jax").engine == "eager"  # the script's own is dropped
    cstorch.config.reset()
    serve_every_backend("jax", "csx", float32=True)
    backend = cstorch.backend("CPU", engine="eager")
    assert backend.is_csx and backend.engine == "jax" and cstorch.use_cs()
    assert not precision.mixed_precision()  # CSX in float32, as the other engines
    model = torch.nn.Linear(2, 1)
    assert cstorch.compile(model) is not None  # (no second backend: the served one is used)
    cstorch.backend._reset_for_tests()
    cstorch.amp.set_half_dtype("bfloat16")  # a script that chooses keeps its choice
    cstorch.backend("CPU")
    assert precision.current_policy().compute_dtype == "bfloat16"


def test_the_eager_engine_registers_torch_optimizers_as_the_jax_engine_adopts_them():
    backend = cstorch.backend("CPU", engine="eager")
    model = torch.nn.Linear(3, 2)
    compiled = cstorch.compile(model, backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    impl = cstorch.backend.current_backend_impl()
    assert impl.optimizer_registry == []
    step(torch.ones(4, 3))
    step(torch.ones(4, 3))
    assert impl.optimizer_registry == [optimizer]  # once
    assert float(optimizer.state_dict()["state"][0]["step"]) == 2


def test_gpu_engine_only_where_jax_sees_a_gpu(monkeypatch):
    from jax_backend import mesh

    monkeypatch.setattr(mesh, "devices", lambda platform=None: [])
    assert runner.available_engines() == ["eager", "jax-cpu"]
    monkeypatch.setattr(
        mesh, "devices", lambda platform=None: ["gpu0"] if platform == "gpu" else []
    )
    assert runner.available_engines() == ["eager", "jax-cpu", "jax-gpu"]
    assert runner._parse(["--engines", "eager,csx", FIXTURE]).engines == ["eager", "csx"]
    with pytest.raises(SystemExit):
        runner._parse(["--engines", "eager", FIXTURE])
    with pytest.raises(SystemExit):
        runner._parse(["--engines", "eager,tpu", FIXTURE])


# ------------------------------------------------------------------------------ the command
def _command(capsys, argv):
    """``python -m cstorch.parity ARGV`` by its ``main`` in this process: the engines still run
    in their own processes, one interpreter start less per call (the test of a script saving
    to a fixed path runs the module itself)."""
    capsys.readouterr()
    status = runner.main(argv)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, status, out, err)


def _parity(capsys, *args):
    return _command(capsys, ["--engines", "eager,jax-cpu", FIXTURE, *args])


@pytest.mark.slow
def test_parity_command_passes_on_agreeing_engines(capsys):
    result = _parity(capsys, "--steps", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PARITY OK" in result.stdout
    lines = [line.split() for line in result.stdout.splitlines()]
    loss_rows = [line for line in lines if len(line) == 5 and line[1] == "log.loss"]
    assert [int(line[0]) for line in loss_rows] == [1, 2, 3, 4, 5]
    for _, _, eager, jax, rel in loss_rows:
        assert abs(float(eager) - float(jax)) <= 1e-4 * abs(float(eager))
        assert float(rel) <= 1e-4


@pytest.mark.slow
@pytest.mark.heavy
def test_parity_command_names_first_diverging_step(capsys):
    result = _parity(capsys, "--steps", "5", "--perturb-step", "3")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FIRST DIVERGENCE at step 3: log.loss" in result.stdout
    assert "PARITY FAILED" in result.stdout


def _torch_adamw_losses(steps):
    """tiny_train.py --torch-optimizer as a plain eager torch loop."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Identity(), torch.nn.Linear(16, 4)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g))
        for _ in range(steps)
    ]
    losses = []
    for inputs, targets in batches:
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model.state_dict(), optimizer.state_dict()


@pytest.mark.slow
def test_parity_ok_for_a_torch_optimizer_on_cpu_and_csx(capsys, tmp_path):
    """A script stepping torch.optim.AdamW: every engine records the optimizer's state under
    the same names (the eager engine used to record none: "state recorded by one engine only"
    and PARITY FAILED), and CSX compares with eager in float32."""
    report = tmp_path / "parity.json"
    result = _command(
        capsys,
        [
            "--engines",
            "eager,jax-cpu,csx",
            "--json",
            str(report),
            FIXTURE,
            "--steps",
            "4",
            "--torch-optimizer",
        ],
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "PARITY OK" in out and "recorded by one engine only" not in out
    assert "tolerances: this run computes in float32; closure values rtol by precision" in out
    document = json.loads(report.read_text())
    expected, _, _ = _torch_adamw_losses(4)
    losses = [row for row in document["rows"] if row["value"] == "log.loss"]
    assert [row["step"] for row in losses] == [1, 2, 3, 4]
    for row, loss in zip(losses, expected):  # eager, jax-cpu and csx against eager torch
        assert row["values"] == pytest.approx([loss] * 3, rel=1e-6)
    for summary in document["engines_vs_reference"]:  # jax-cpu, csx: with the optimizer
        assert summary["final_state"]["missing"] == []
        assert summary["final_state"]["max_rel"] < 1e-4
    assert "final state (models and optimizers, 16 tensors)" in out  # 4 params x 3 + 4


@pytest.mark.slow
@pytest.mark.heavy
def test_parity_still_fails_a_torch_optimizer_run_that_disagrees(capsys):
    result = _command(
        capsys,
        [
            "--engines",
            "eager,csx",
            FIXTURE,
            "--steps",
            "4",
            "--torch-optimizer",
            "--perturb-step",
            "3",
        ],
    )
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "FIRST DIVERGENCE at step 3: log.loss" in out and "PARITY FAILED" in out
    assert "recorded by one engine only" not in out


@pytest.mark.slow
@pytest.mark.heavy
def test_parity_compares_csx_in_its_own_mixed_precision_when_asked(capsys):
    result = _command(
        capsys, ["--engines", "eager,csx", "--csx-mixed-precision", FIXTURE, "--steps", "3"]
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert (
        "this run computes in float16 (mixed precision) on csx, float32 on eager "
        "(compared at the coarser precision's tolerance); closure values rtol by "
        "precision (float32 0.0001, float16 0.002, bfloat16 0.01): 0.002 here"
    ) in out
    largest = float(out.split("largest relative difference ")[1].split()[0])
    assert 1e-6 < largest < 2e-3  # float16 matmuls: near eager's float32, not equal to it


@pytest.mark.slow
def test_parity_command_reports_a_failing_engine(tmp_path, capsys):
    script = tmp_path / "broken.py"
    script.write_text("raise RuntimeError('boom in the script')\n")
    result = _command(capsys, [str(script)])
    assert result.returncode == 2
    assert "the eager run failed" in result.stderr and "boom in the script" in result.stderr


@pytest.mark.slow
@pytest.mark.heavy
def test_a_script_saving_to_a_fixed_path_runs_twice_and_under_parity(tmp_path):
    # cstorch.save overwrites like torch.save, and each engine gets its own working directory
    # (the second engine must not find, resume from or collide with the first one's files).
    run = [sys.executable, os.path.abspath(FIXTURE), "--steps", "2", "--save"]
    for _ in range(2):
        result = fork_server.run(run, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    saved = cstorch.load(str(tmp_path / "checkpoint.mdl"))
    assert set(saved) == {"model", "optimizer"}
    before = (tmp_path / "checkpoint.mdl").stat().st_mtime_ns
    result = fork_server.run(
        [
            sys.executable,
            "-m",
            "cstorch.parity",
            "--engines",
            "eager,jax-cpu",
            "--verbose",
            os.path.abspath(FIXTURE),
            "--steps",
            "2",
            "--save",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PARITY OK" in result.stdout and "own working directory" in result.stdout
    assert (tmp_path / "checkpoint.mdl").stat().st_mtime_ns == before  # engines wrote elsewhere
    assert "RuntimeWarning" not in result.stderr  # (runpy's, about cstorch.parity.record)


@pytest.mark.slow
@pytest.mark.heavy
def test_parity_names_random_ops_and_unzeroed_gradients(capsys):
    result = _parity(capsys, "--steps", "3", "--dropout", "0.5", "--no-zero-grad")
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "FIRST DIVERGENCE at step 1" in out
    assert "likely cause: the step uses random ops (dropout)" in out
    assert "from the first step" in out
    assert "warning from the jax-cpu run: GradientAccumulationWarning" in out
    assert "likely cause: the step does not zero its gradients" in out


@pytest.mark.slow
@pytest.mark.heavy
def test_parity_tolerances_follow_the_precision(capsys):
    result = _parity(capsys, "--steps", "3", "--precision", "bfloat16")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "tolerances: this run computes in bfloat16 (mixed precision); closure values rtol "
        "by precision (float32 0.0001, float16 0.002, bfloat16 0.01): 0.01 here"
    ) in result.stdout
    result = _command(
        capsys,
        [
            "--engines",
            "eager,jax-cpu",
            "--rtol",
            "1e-9",
            FIXTURE,
            "--steps",
            "3",
            "--precision",
            "bfloat16",
        ],
    )
    assert result.returncode == 1 and "rtol=1e-09 (--rtol)" in result.stdout


def test_tolerance_precision_is_the_coarser_of_value_and_run():
    from cstorch.parity.runner import RTOL_BY_PRECISION, precision_of

    assert precision_of("float32", "float32") == "float32"
    assert precision_of("float32", "bfloat16") == "bfloat16"
    assert precision_of("float16", "float32") == "float16"
    assert precision_of("int64", "float16") == "float16"
    assert RTOL_BY_PRECISION["float32"] <= 1e-4


def test_path_arguments_are_made_absolute_for_the_engines_directories(tmp_path, monkeypatch):
    from cstorch.parity.runner import absolute_path_arguments

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.csv").write_text("1\n")
    assert absolute_path_arguments(["data.csv", "--in=data.csv", "out.mdl", "--steps", "3"]) == [
        str(tmp_path / "data.csv"),
        f"--in={tmp_path / 'data.csv'}",
        "out.mdl",
        "--steps",
        "3",
    ]


def test_gradient_accumulation_warning_only_without_any_zero_grad(cpu_backend):
    import warnings

    from cstorch.core.compile import GradientAccumulationWarning

    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model, cpu_backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    def make(zero_inside):
        @cstorch.trace
        def step(x):
            loss = compiled(x).sum()
            if zero_inside:
                model.zero_grad()
            loss.backward()
            optimizer.step()
            return loss

        return step

    x = torch.ones(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GradientAccumulationWarning)
        inside = make(True)
        inside(x), inside(x), inside(x)
        between = make(False)
        for _ in range(3):
            between(x)
            optimizer.zero_grad()  # zeroed between the calls, as eager torch needs
    never = make(False)
    never(x)
    with pytest.warns(GradientAccumulationWarning, match="zero_grad"):
        never(x)


# ------------------------------------------------------------- rounding noise (issue 31)
CNN = os.path.join(DATA, "parity", "cnn_train.py")


def _parity_of_the_cnn(capsys, monkeypatch, *args):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, os.path.join(REPO, "compat")]))
    return _command(capsys, ["--engines", "eager,jax-cpu", CNN, *args])


@pytest.mark.slow
@pytest.mark.heavy
def test_parity_passes_a_cnn_whose_bias_before_batchnorm_follows_rounding_noise(
    capsys, monkeypatch
):
    """A conv bias before BatchNorm has a zero gradient in exact arithmetic: Adam turns its
    rounding noise into full-size moments that no engine reproduces (eager vs eager with one
    rounding step of difference changes them as much). The tool used to fail this ordinary
    fp32 CNN on them; it names them and their cause instead."""
    result = _parity_of_the_cnn(capsys, monkeypatch)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "PARITY OK" in out
    noise = next(line for line in out.splitlines() if "rounding noise:" in line)
    assert "exp_avg_sq of model0.3.bias" in noise  # the second conv's bias, before BatchNorm
    assert "model0.3.weight" not in noise and "running" not in noise
    assert "likely cause: those tensors follow rounding noise" in out
    losses = [line.split() for line in out.splitlines() if " log.loss " in line]
    assert len(losses) == 8 and all(float(line[4]) <= 1e-6 for line in losses)


@pytest.mark.slow
@pytest.mark.heavy
def test_parity_still_fails_a_wrong_lowering_in_that_cnn(capsys, monkeypatch):
    result = _parity_of_the_cnn(capsys, monkeypatch, "--wrong-lowering")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "PARITY FAILED" in out and "FIRST DIVERGENCE at step" in out
    assert "beyond the tolerance, and not what eager itself varies by: model0.0.weight" in out
    assert "likely cause: those tensors follow rounding noise" not in out


def test_state_comparison_keeps_every_tensors_relative_difference():
    a = {"w": np.array([1.0, 2.0]), "b": np.array([0.0, 1e-8])}
    b = {"w": np.array([1.0, 2.002]), "b": np.array([0.0, 3e-8])}
    state = compare_state(a, b)
    assert state.relative == pytest.approx({"w": 1e-3, "b": 2.0})
    assert state.beyond(1e-2) == ["b"] and state.beyond(1e-4) == ["b", "w"]
