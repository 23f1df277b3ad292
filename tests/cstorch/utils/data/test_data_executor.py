"""DataLoader, DataExecutor and step/checkpoint closures."""

import json
import os
import pathlib

import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.utils.data import DataExecutor, DataLoader, Schedule
from tests import fork_server
from tests.paths import REPO


def _batches(n, size=4):
    return [
        (torch.full((size, 2), float(i)), torch.zeros(size, dtype=torch.long)) for i in range(n)
    ]


def test_dataloader_validates_and_deep_copies_its_arguments():
    with pytest.raises(TypeError, match="got int\\.$"):
        DataLoader(5)
    torch_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4)))
    with pytest.raises(TypeError, match=r"DataLoader\(lambda: loader\)"):
        DataLoader(torch_loader)  # a porter's first try
    config = {"n": 2}

    def input_fn(config):
        return _batches(config["n"])

    loader = DataLoader(input_fn, config)
    config["n"] = 10
    assert len(loader) == 2
    assert loader.id >= 1 and DataLoader(input_fn, config).id == loader.id + 1


def test_executor_checkpoint_schedule_and_closures(cpu_backend):
    ran = []

    @cstorch.checkpoint_closure
    def save(step):
        ran.append(step)

    save("before")  # queued before the loop: runs when the executor starts
    executor = DataExecutor(DataLoader(lambda: _batches(10)), num_steps=10, checkpoint_steps=4)
    for step, _ in enumerate(executor, start=1):
        save(step)
    assert ran == ["before", 4, 8, 10]


def test_executor_cycles_an_exhausted_dataloader(cpu_backend):
    seen = [float(x[0, 0]) for x, _ in DataExecutor(DataLoader(lambda: _batches(3)), num_steps=7)]
    assert seen == [0, 1, 2, 0, 1, 2, 0]


def test_executor_errors(cpu_backend):
    class NoLength:
        def __iter__(self):
            return iter(_batches(2))

    with pytest.raises(RuntimeError, match="Could not infer the number of steps"):
        DataExecutor(DataLoader(NoLength))
    with pytest.raises(RuntimeError):
        DataExecutor(DataLoader(lambda: _batches(2)), num_steps=0)
    with pytest.raises(ValueError):
        DataExecutor(DataLoader(lambda: _batches(2)), checkpoint_steps="x")
    with pytest.raises(RuntimeError):
        DataExecutor(DataLoader(lambda: _batches(2)), activation_steps=0)
    with pytest.raises(TypeError, match=r"DataLoader\(lambda: loader\)"):
        DataExecutor(_batches(2), num_steps=2)
    empty = DataExecutor(DataLoader(lambda: []), num_steps=2)
    with pytest.raises(RuntimeError, match="no batches"):
        list(empty)


def test_executor_artifacts(cpu_backend, tmp_path):
    executor = DataExecutor(DataLoader(lambda: _batches(2)), num_steps=2)
    with pytest.raises(RuntimeError):
        executor.artifact_dir
    for _ in executor:
        # a pathlib.Path, as in the reference (the Model Zoo joins it with "/")
        assert isinstance(executor.artifact_dir, pathlib.Path)
        assert executor.artifact_dir.parts[-2:] == ("executors", "000001")
    latest = os.path.join(str(tmp_path), "executors", "latest")
    assert os.path.islink(latest) and os.readlink(latest) == "000001"
    # performance.json: with the one default activity, its summary itself (reference layout)
    with open(executor.artifact_dir / "performance.json") as f:
        performance = json.load(f)
    assert set(performance) == {
        "total_samples",
        "total_time",
        "rate",
        "global_rate",
        "samples_per_sec",
        "flops_utilization",
    }
    assert performance["total_samples"] == 8 and performance["flops_utilization"] is None
    assert performance["samples_per_sec"] == performance["global_rate"] > 0
    assert executor.profiler.rate_tracker.global_rate > 0
    # track.json: {stage: [seconds, {children}]}; the CPU backend's "Initialization" stage is
    # never stopped, so it counts 0 seconds, as in the reference
    with open(executor.artifact_dir / "track.json") as f:
        assert json.load(f) == {"Initialization": [0.0, {}]}
    second = DataExecutor(DataLoader(lambda: _batches(1)), num_steps=1)
    list(second)
    assert second.artifact_dir.name == "000002"


def test_executor_step_properties(cpu_backend):
    executor = DataExecutor(DataLoader(lambda: _batches(3)), num_steps=3)
    states = [
        (
            executor.iteration,
            executor.user_iteration,
            executor.is_initial_step,
            executor.on_final_iteration,
        )
        for _ in executor
    ]
    assert states == [(0, 1, True, False), (1, 2, False, False), (2, 3, False, True)]
    assert cstorch.current_executor
    with pytest.raises(RuntimeError, match="data executor was not used"):
        cstorch.current_executor()


def test_step_closure_without_backend_runs_immediately():
    calls = []

    @cstorch.step_closure
    def closure(x):
        calls.append(x)

    assert closure(3) is None and calls == [3]
    assert closure.is_step_closure


def test_step_closures_wait_for_the_executor_and_see_snapshots(cpu_backend):
    seen = []

    @cstorch.step_closure
    def record(tensor):
        seen.append(tensor.clone())

    value = torch.zeros(2)
    for _ in DataExecutor(DataLoader(lambda: _batches(1)), num_steps=1):
        record(value)
        value.add_(5)  # the closure was given a snapshot
        assert seen == []  # it runs after the step
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], torch.zeros(2))


def test_checkpoint_closure_needs_a_backend(tmp_path):
    @cstorch.checkpoint_closure
    def save():
        pass

    with pytest.raises(RuntimeError, match="No active Cerebras backend"):
        save()


def test_closures_in_a_traced_step_receive_their_own_steps_values(cpu_backend):
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    compiled = cstorch.compile(model, cpu_backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.5)
    values = []

    @cstorch.step_closure
    def record(loss, weight):
        values.append((loss.item(), weight.sum().item()))

    @cstorch.trace
    def step(x, _):
        loss = compiled(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record(loss, model.weight)
        return loss

    for batch in DataExecutor(DataLoader(lambda: _batches(3, size=1)), num_steps=3):
        step(*batch)
    # x = i * ones(1, 2): loss = i * sum(w); grad = i * ones; w -= 0.5 * i (after the record)
    assert values == [(0.0, 2.0), (2.0, 1.0), (2.0, -1.0)]


def test_schedule_ranges():
    schedule = Schedule([Schedule.Range(start=3, end=10, step=4, include_last=True)])
    assert schedule.range() == [3, 7, 9]
    assert schedule.match(7) and not schedule.match(8)
    assert schedule.next_immediate_step(4) == 7
    with pytest.raises(ValueError):
        Schedule([Schedule.Range(0, 5, 1, False), Schedule.Range(3, 8, 1, False)])
    with pytest.raises(ValueError):
        Schedule.Range(start=5, end=5, step=1, include_last=False)


# ------------------------------------------------------------------ steps outside an executor
@pytest.mark.parametrize("engine", ["jax", "eager"])
def test_closures_of_a_step_called_outside_an_executor_run_after_it(tmp_path, engine):
    # Eager torch would print after every step; 2.10 keeps them queued until a DataExecutor
    # starts (usually never). Here they run after the step, with that step's values.
    cstorch.backend("CPU", artifact_dir=str(tmp_path), engine=engine)
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.5)
    values = []

    @cstorch.step_closure
    def record(loss, weight):
        values.append((loss.item(), weight.sum().item()))

    @cstorch.trace
    def step(x):
        loss = compiled(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record(loss, model.weight)
        return loss

    for i in range(3):
        step(torch.full((1, 2), float(i)))
        assert len(values) == i + 1  # right after its own step
    assert values == [(0.0, 2.0), (2.0, 1.0), (2.0, -1.0)]
    assert cstorch.backend()._impl.step_closures == []


def test_a_checkpoint_closure_in_a_step_outside_an_executor_raises(cpu_backend):
    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model, cpu_backend)
    saved = []

    @cstorch.checkpoint_closure
    def save_ckpt(step_):
        saved.append(step_)

    @cstorch.trace
    def step(x):
        out = compiled(x).sum()
        save_ckpt(out)
        return out

    with pytest.raises(
        RuntimeError,
        match="'save_ckpt' was called from a step that runs outside a cstorch DataExecutor",
    ):
        step(torch.ones(1, 2))
    assert saved == [] and cpu_backend._impl.step_closures == []


@pytest.mark.parametrize("engine", ["jax", "eager"])
def test_closures_called_from_a_loop_without_an_executor_run_at_once(tmp_path, engine):
    """The quickstart's ``log(loss, step)`` and a checkpoint closure called from a loop with
    no DataExecutor: 2.10 queues them until an executor starts, so they never ran (only a
    warning at exit, after the user believed the checkpoint was written). They run at once,
    with the values of the step before (issue 31, item 2)."""
    cstorch.backend("CPU", artifact_dir=str(tmp_path), engine=engine)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    reference = torch.nn.Linear(2, 1)
    reference.load_state_dict(model.state_dict())
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    logged, saved = [], []

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    @cstorch.step_closure
    def log(loss, i):
        logged.append((i, loss.item()))

    @cstorch.checkpoint_closure
    def save(i):
        path = tmp_path / f"checkpoint_{i}.mdl"
        cstorch.save({"model": model.state_dict()}, str(path))
        saved.append(path)

    for i in range(1, 4):
        x = torch.full((4, 2), float(i))
        log(step(x), i)
        assert [j for j, _ in logged] == list(range(1, i + 1))  # right away
        expected = reference(x).square().mean()
        reference_optimizer.zero_grad()
        expected.backward()
        reference_optimizer.step()
        assert logged[-1][1] == pytest.approx(expected.item(), rel=1e-6)
        save(i)
        assert saved[-1].exists()  # written before the loop goes on
        weights = cstorch.load(str(saved[-1]))["model"]
        torch.testing.assert_close(torch.as_tensor(weights["weight"]), reference.weight.detach())
    assert cstorch.backend()._impl.step_closures == []


@pytest.mark.slow
def test_a_checkpoint_closure_called_before_the_loop_saves_at_once(tmp_path):
    script = tmp_path / "initial.py"
    script.write_text(
        "import cerebras.pytorch as cstorch\n"
        "cstorch.backend('CPU')\n"
        "@cstorch.checkpoint_closure\n"
        "def save_ckpt():\n"
        "    print('saved')\n"
        "save_ckpt()\n"
        "print('after the call')\n"
    )
    import sys

    root = pathlib.Path(REPO)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "compat")]))
    result = fork_server.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["saved", "after the call"]
    assert "QueuedClosureWarning" not in result.stderr


@pytest.mark.parametrize("backend_type", ["CPU", "CSX"])
def test_a_short_loader_cycles_on_every_backend(tmp_path, backend_type):
    cstorch.backend(backend_type, artifact_dir=str(tmp_path))
    seen = [float(x[0, 0]) for x, _ in DataExecutor(DataLoader(lambda: _batches(3)), num_steps=7)]
    assert seen == [0, 1, 2, 0, 1, 2, 0]
