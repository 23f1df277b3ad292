"""Ctrl-C during a DataExecutor run stops it between two steps (issue 44, item 6).

The checkpoints page's pattern, a save in ``except KeyboardInterrupt`` around the loop, used to
resume one batch off when the interrupt landed after the executor had drawn the next batch
(in the loop body, or mid-step on the eager engine): the loop variable named a step whose
update never happened. Real runs are interrupted by a real SIGINT at chosen points, saved,
resumed, and their losses compared with the uninterrupted run's, which is checked against an
eager torch loop.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

import cerebras.pytorch as cstorch
from tests import fork_server
from tests.cstorch.utils.data import interrupted_training
from tests.paths import REPO

pytestmark = pytest.mark.core

SCRIPT = os.path.join(os.path.dirname(__file__), "interrupted_training.py")
STEPS = 8


def _env():
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "compat")]),
        CSTORCH_PROGRESS="off",
    )


def _run(directory, *args):
    directory.mkdir(exist_ok=True)
    out = directory / "run.json"
    result = fork_server.run(
        [sys.executable, SCRIPT, str(out), "--steps", str(STEPS), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=directory,
        env=_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text()), result


def _losses(run) -> dict:
    return {int(step): loss for step, loss in run["losses"].items()}


def _eager_torch_losses() -> dict:
    """The script's run as a plain eager torch loop (torch's AdamW, the same batches)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = {}
    for step in range(1, STEPS + 1):
        x, y = interrupted_training.batch(step - 1)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses[step] = loss.item()
    return losses


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each engine's uninterrupted losses, checked against eager torch."""
    reference = _eager_torch_losses()
    runs = {}
    for engine in ("jax", "eager"):
        run, _ = _run(tmp_path_factory.mktemp(f"full-{engine}"), "--engine", engine)
        runs[engine] = _losses(run)
        assert sorted(runs[engine]) == list(range(1, STEPS + 1))
        for step, loss in reference.items():
            assert runs[engine][step] == pytest.approx(loss, rel=1e-5), (engine, step)
    return runs


def _check_resumes_exactly(tmp_path, uninterrupted, engine, position, interrupted_args, at=4):
    run, result = _run(
        tmp_path / "interrupted", "--engine", engine, "--position", position, *interrupted_args
    )
    checkpoint = tmp_path / "interrupted" / "interrupted.mdl"
    resumed, _ = _run(
        tmp_path / "resumed",
        "--engine",
        engine,
        "--position",
        position,
        "--resume",
        str(checkpoint),
    )
    expected = {s: uninterrupted[engine][s] for s in range(run["saved_at"] + 1, STEPS + 1)}
    assert _losses(resumed) == pytest.approx(expected, rel=1e-6, abs=0)  # the same steps
    # The run stopped once step `at` was whole (the interrupt held until its end), and said so.
    assert run["saved_at"] == at, result.stdout + result.stderr
    assert _losses(run) == pytest.approx(
        {s: uninterrupted[engine][s] for s in range(1, at + 1)}, rel=1e-6, abs=0
    )
    assert "the run stops after the current step" in result.stderr


CASES = [  # (where Ctrl-C lands at step 4, engine, how the data position is saved)
    ("body", "jax", "step"),  # after the batch is drawn, before the step: used to skip it
    ("loader", "jax", "loader"),  # while the executor draws the batch
    ("forward", "eager", "step"),  # mid-step, on the eager engine: used to drop the step
]


@pytest.mark.slow
@pytest.mark.parametrize("where,engine,position", CASES, ids=[f"{w}-{e}-{p}" for w, e, p in CASES])
def test_a_save_in_except_keyboard_interrupt_resumes_exactly(
    tmp_path, uninterrupted, where, engine, position
):
    _check_resumes_exactly(
        tmp_path, uninterrupted, engine, position, ["--interrupt-at", "4", "--where", where]
    )


@pytest.mark.slow
def test_ctrl_c_from_another_process_mid_loop_resumes_exactly(tmp_path, uninterrupted):
    """The terminal's Ctrl-C: SIGINT sent by another process while the loop body of step 4
    runs (the executor has drawn batch 4; the step has not started)."""
    go = tmp_path / "go"
    directory = tmp_path / "interrupted"
    directory.mkdir()
    process = subprocess.Popen(
        [
            sys.executable,
            SCRIPT,
            str(directory / "run.json"),
            "--steps",
            str(STEPS),
            "--interrupt-at",
            "4",
            "--wait-for",
            str(go),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=directory,
        env=_env(),
    )
    try:
        for line in process.stdout:
            if line.strip() == "waiting":
                break
        process.send_signal(signal.SIGINT)
        go.write_text("")
        stdout, stderr = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stdout + stderr
    run = json.loads((directory / "run.json").read_text())
    resumed, _ = _run(tmp_path / "resumed", "--resume", str(directory / "interrupted.mdl"))
    assert _losses(resumed) == pytest.approx(
        {s: uninterrupted["jax"][s] for s in range(run["saved_at"] + 1, STEPS + 1)}, rel=1e-6, abs=0
    )
    assert run["saved_at"] == 4 and "the run stops after the current step" in stderr


# ------------------------------------------------------------------ in this process
@pytest.fixture(autouse=True)
def _ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt here, as in a terminal (see test_faults.py)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _executor(steps=6):
    batches = [torch.full((2, 3), float(i)) for i in range(steps)]
    return cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: batches), num_steps=steps
    )


def _step(backend):
    model = torch.nn.Linear(3, 1)
    compiled = cstorch.compile(model, backend)

    @cstorch.trace
    def step(x):
        return compiled(x).sum()

    return step


def test_ctrl_c_waits_for_the_step_a_second_one_stops_at_once(cpu_backend, capsys):
    step, done = _step(cpu_backend), []
    with pytest.raises(KeyboardInterrupt):
        for i, x in enumerate(_executor(), start=1):
            if i == 2:
                signal.raise_signal(signal.SIGINT)  # held: step 2 still runs
            step(x)
            done.append(i)
    assert done == [1, 2]
    assert "press Ctrl-C again to stop at once" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
    done.clear()
    with pytest.raises(KeyboardInterrupt):
        for i, x in enumerate(_executor(), start=1):
            if i == 2:
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGINT)  # the second: raised here, now
            step(x)
            done.append(i)
    assert done == [1]


def test_ctrl_c_in_the_last_step_is_raised_after_it(cpu_backend):
    step, done = _step(cpu_backend), []
    with pytest.raises(KeyboardInterrupt):
        for i, x in enumerate(_executor(3), start=1):
            if i == 3:
                signal.raise_signal(signal.SIGINT)
            step(x)
            done.append(i)
    assert done == [1, 2, 3]


def test_a_nested_executor_stops_at_its_own_step_boundary(cpu_backend):
    step, seen = _step(cpu_backend), []
    with pytest.raises(KeyboardInterrupt):
        for i, x in enumerate(_executor(4), start=1):
            step(x)
            for j, y in enumerate(_executor(3), start=1):  # an eval loop
                if (i, j) == (2, 1):
                    signal.raise_signal(signal.SIGINT)
                step(y)
                seen.append((i, j))
    assert seen == [(1, 1), (1, 2), (1, 3), (2, 1)]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_users_own_sigint_handler_is_left_alone(cpu_backend):
    step, calls = _step(cpu_backend), []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        for i, x in enumerate(_executor(3), start=1):
            if i == 2:
                signal.raise_signal(signal.SIGINT)
            step(x)
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_loader_state_after_an_interrupt_and_not_after_a_plain_end(cpu_backend):
    from tests.cstorch.utils.data.test_data_utils import CountingLoader

    step = _step(cpu_backend)
    loader = cstorch.utils.data.DataLoader(CountingLoader, 3)
    with pytest.raises(KeyboardInterrupt):
        for i, batch in enumerate(cstorch.utils.data.DataExecutor(loader, num_steps=5), start=1):
            if i == 2:
                signal.raise_signal(signal.SIGINT)
            step(batch.float().unsqueeze(-1).expand(3, 3))
    state = loader.state_dict()["worker_0"]
    assert state == {"position": 6, "samples_streamed": 6}  # two batches of three
    for batch in cstorch.utils.data.DataExecutor(loader, num_steps=1):
        step(batch.float().unsqueeze(-1).expand(3, 3))
    with pytest.raises(RuntimeError, match="after Ctrl-C stopped the run"):
        loader.state_dict()
