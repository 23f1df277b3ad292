"""DataLoader, DataExecutor and step/checkpoint closures (api_inventory §5, §6, §16.8-16)."""

import json
import os
import pathlib

import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.utils.data import DataExecutor, DataLoader, Schedule


def _batches(n, size=4):
    return [(torch.full((size, 2), float(i)), torch.zeros(size, dtype=torch.long)) for i in range(n)]


def test_dataloader_validates_and_deep_copies_its_arguments():
    with pytest.raises(TypeError):
        DataLoader(5)
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
    with pytest.raises(TypeError):
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
    assert set(performance) == {"total_samples", "total_time", "rate", "global_rate",
                                "samples_per_sec", "flops_utilization"}
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
    states = [(executor.iteration, executor.user_iteration, executor.is_initial_step,
               executor.on_final_iteration) for _ in executor]
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
    record(value)
    value.add_(5)  # the closure was given a snapshot
    assert seen == []
    for _ in DataExecutor(DataLoader(lambda: _batches(1)), num_steps=1):
        pass
    torch.testing.assert_close(seen[0], torch.zeros(2))


def test_checkpoint_closure_needs_a_backend_and_an_executor():
    @cstorch.checkpoint_closure
    def save():
        pass

    with pytest.raises(RuntimeError, match="No active Cerebras backend"):
        save()
    cstorch.backend("CPU")
    save()
    with pytest.raises(RuntimeError, match="outside of an execution context"):
        cstorch.backend()._impl.run_step_closures()


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

    with pytest.raises(RuntimeError, match="'save_ckpt' was called from a step that runs "
                                           "outside a cstorch DataExecutor"):
        step(torch.ones(1, 2))
    assert saved == [] and cpu_backend._impl.step_closures == []


def test_closures_queued_outside_an_executor_that_never_run_are_reported_at_exit(tmp_path):
    script = tmp_path / "queued.py"
    script.write_text(
        "import cerebras.pytorch as cstorch\n"
        "cstorch.backend('CPU')\n"
        "@cstorch.checkpoint_closure\n"
        "def save_ckpt():\n"
        "    print('saved')\n"
        "save_ckpt()\n")
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "saved" not in result.stdout
    assert "QueuedClosureWarning" in result.stderr
    assert "(save_ckpt) were queued outside a cstorch DataExecutor and never ran" in result.stderr


@pytest.mark.parametrize("backend_type", ["CPU", "CSX"])
def test_a_short_loader_cycles_on_every_backend(tmp_path, backend_type):
    cstorch.backend(backend_type, artifact_dir=str(tmp_path))
    seen = [float(x[0, 0]) for x, _ in DataExecutor(DataLoader(lambda: _batches(3)), num_steps=7)]
    assert seen == [0, 1, 2, 0, 1, 2, 0]
