"""cstorch.utils.data beyond the executor: restartable dataloaders across checkpoints,
SyntheticDataset, DistributedSampler, Schedule, compute_num_steps and the rate tracker
(the progress display: tests/cstorch/utils/test_progress.py)."""

from __future__ import annotations

import collections

import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.utils.data import (
    DataExecutor,
    DataLoader,
    DistributedSampler,
    Schedule,
    SyntheticDataset,
    compute_num_steps,
)
from cstorch.utils.data.dataloader import DataLoaderCheckpoint
from cstorch.utils.data.sampler import pad_index


class CountingLoader:
    """A restartable loader of batches [i*bs, (i+1)*bs) that records worker states."""

    def __init__(self, batch_size=2, num_batches=100):
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.position = 0  # samples yielded so far
        self.worker_states = []

    def __iter__(self):
        while self.position < self.num_batches * self.batch_size:
            start = self.position
            self.position += self.batch_size
            yield torch.arange(start, start + self.batch_size)

    def __len__(self):
        return self.num_batches

    def state_dict(self):
        state = cstorch.distributed.get_worker_state()
        self.worker_states.append(state)
        return {"position": self.position, "samples_streamed": state.samples_streamed}

    def load_state_dict(self, state_dict, strict=True):
        self.position = state_dict["position"]

    def aggregate_state_dict(self, worker_states):
        return {"worker_0": worker_states[0]}

    def deaggregate_state_dict(self, aggregated_state_dict, strict=True):
        return aggregated_state_dict["worker_0"]


def test_restartable_dataloader_resumes_at_the_checkpointed_sample(cpu_backend, tmp_path):
    model = torch.nn.Linear(1, 1)
    compiled = cstorch.compile(model, cpu_backend)

    @cstorch.trace
    def step(batch):
        return compiled(batch.float().unsqueeze(-1)).sum()

    loader = DataLoader(CountingLoader)
    path = tmp_path / "ckpt.mdl"

    @cstorch.checkpoint_closure
    def save(executor_step):
        cstorch.save({"dataloader": loader.state_dict(), "step": executor_step}, str(path))

    seen = []
    for i, batch in enumerate(DataExecutor(loader, num_steps=4, checkpoint_steps=4), start=1):
        step(batch)
        seen.append(batch.tolist())
        save(i)
    assert seen[-1] == [6, 7]
    state = cstorch.load(str(path))
    assert state["step"] == 4 and state["dataloader"]["worker_0"]["position"] == 8
    assert state["dataloader"]["worker_0"]["samples_streamed"] == 8

    resumed = DataLoader(CountingLoader)
    resumed.load_state_dict(state["dataloader"])
    first = next(iter(DataExecutor(resumed, num_steps=2)))
    assert first.tolist() == [8, 9]


def test_dataloader_state_dict_only_at_checkpoint_steps(cpu_backend):
    loader = DataLoader(CountingLoader)
    for _ in DataExecutor(loader, num_steps=3, checkpoint_steps=5):
        with pytest.raises(RuntimeError, match="checkpoint step"):
            loader.state_dict()
        break


def test_worker_state_describes_one_worker_and_is_fetched_once(monkeypatch):
    from cstorch.distributed.worker_state import WorkerState

    monkeypatch.setattr(WorkerState, "_state", None)
    state = DataLoaderCheckpoint(
        local_worker_id=0,
        num_workers_per_csx=2,
        num_csx=3,
        wse_id=1,
        appliance_step=4,
        worker_step=4,
        samples_streamed=32,
        user_state_dict=None,
    )
    assert state.global_worker_id == 2 and state.total_num_workers == 6
    with pytest.raises(RuntimeError, match="only once"):
        cstorch.distributed.get_worker_state()
    WorkerState.configure(state)
    assert cstorch.distributed.get_worker_state() is state
    with pytest.raises(RuntimeError):
        cstorch.distributed.get_worker_state()


# ------------------------------------------------------------------------ SyntheticDataset
Sample = collections.namedtuple("Sample", "x y")


def _index_tensor(index):
    return torch.tensor(index)


def test_synthetic_dataset_clones_tensors_and_calls_callables():
    spec = {"a": torch.ones(2), "b": [Sample(torch.zeros(1), _index_tensor)]}
    dataset = SyntheticDataset(spec, num_samples=3)
    samples = list(dataset)
    assert len(dataset) == 3 and len(samples) == 3
    assert [int(s["b"][0].y) for s in samples] == [0, 1, 2]
    assert isinstance(samples[0]["b"][0], Sample)
    samples[0]["a"].add_(1)
    assert torch.equal(samples[1]["a"], torch.ones(2))
    loader = torch.utils.data.DataLoader(dataset, batch_size=3)
    assert next(iter(loader))["a"].shape == (3, 2)


@pytest.mark.parametrize(
    "spec,num_samples,error",
    [
        ({}, None, ValueError),
        ([1.0], None, ValueError),
        (torch.ones(1), 0, ValueError),
        (torch.ones(1), 2.5, TypeError),
        (torch.ones(1), True, TypeError),
    ],
)
def test_synthetic_dataset_validation(spec, num_samples, error):
    with pytest.raises(error):
        SyntheticDataset(spec, num_samples=num_samples)


def test_endless_synthetic_dataset_has_no_length():
    dataset = SyntheticDataset(torch.zeros(1))
    with pytest.raises(TypeError, match="num_samples"):
        len(dataset)
    iterator = iter(dataset)
    assert all(next(iterator).shape == (1,) for _ in range(5))


# ------------------------------------------------------------------------ DistributedSampler
def test_sampler_without_shuffle_batches_and_carries_leftovers_over():
    sampler = DistributedSampler(range(10), shuffle=False, batch_size=4)
    assert len(sampler) == 2
    assert list(sampler) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(sampler) == [[8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]]


def test_sampler_padding_and_partial_last_batch():
    assert list(DistributedSampler(range(5), shuffle=False, batch_size=2, drop_last=False)) == [
        [0, 1],
        [2, 3],
        [4],
    ]
    padded = list(
        DistributedSampler(range(5), shuffle=False, batch_size=2, drop_last=False, pad_last=True)
    )
    assert padded[-1][0] == 4 and padded[-1][1] is pad_index


def test_sampler_shuffle_is_a_seeded_permutation_and_resumes():
    first = list(DistributedSampler(range(20), seed=3))
    assert sorted(first) == list(range(20)) and first != list(range(20))
    assert first == list(DistributedSampler(range(20), seed=3))
    resumed = DistributedSampler(range(20), seed=3, start_index=7)
    assert list(resumed) == first[7:]
    sampler = DistributedSampler(range(20), seed=3)
    sampler.set_state(25)  # one epoch and 5 samples in: epoch 1's order from its 6th sample
    epoch1 = list(DistributedSampler(range(20), seed=4))  # epoch e shuffles with seed + e
    assert list(sampler) == epoch1[5:]


def test_sampler_num_samples_extends_an_epoch():
    sampler = DistributedSampler(range(4), shuffle=False, num_samples=6)
    assert list(sampler) == [0, 1, 2, 3, 0, 1]
    shuffled = list(DistributedSampler(range(4), seed=0, num_samples=10))
    assert len(shuffled) == 10 and collections.Counter(shuffled)[0] in (2, 3)


def test_sampler_checks_of_the_csx_backend(tmp_path):
    cstorch.backend("CSX", artifact_dir=str(tmp_path))
    with pytest.raises(ValueError, match="drop_last"):
        DistributedSampler(range(4), batch_size=2, drop_last=False)
    with pytest.raises(ValueError, match="batch_size"):
        DistributedSampler(range(4))


# ------------------------------------------------------------------------ schedules, steps
def test_schedule_matching_and_validation():
    schedule = Schedule(
        [
            Schedule.Range(start=3, end=10, step=3, include_last=True),
            Schedule.Range(start=12, end=14, step=1, include_last=False),
        ]
    )
    assert [i for i in range(15) if schedule.match(i)] == [3, 6, 9, 12, 13]
    assert list(schedule) == [3, 6, 9, 12, 13] and len(schedule) == 5
    assert schedule.start == 3 and schedule.final_step == 13
    assert schedule.next_immediate_step(7) == 9 and schedule.next_immediate_step(14) is None
    with pytest.raises(ValueError, match="overlap"):
        Schedule([Schedule.Range(0, 5, 1, False), Schedule.Range(4, 8, 1, False)])
    for bad in [(-1, 2, 1, False), (3, 3, 1, False), (0, 2, 0, False), (0, 2, 1, 1)]:
        with pytest.raises(ValueError):
            Schedule.Range(*bad)
    with pytest.raises(ValueError):
        Schedule([(0, 1, 1, False)])


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        (dict(num_steps=7), 7),
        (dict(num_epochs=2), 20),
        (dict(num_epochs=2, steps_per_epoch=4), 8),
        (dict(num_epochs=3, grad_accum_steps=3), 9),
        (dict(max_steps=15, initial_step=10), 5),
        (dict(num_steps=30, max_steps=25, initial_step=5), 20),
    ],
)
def test_compute_num_steps(kwargs, expected):
    assert compute_num_steps(list(range(10)), **kwargs) == expected


@pytest.mark.parametrize(
    "kwargs,error",
    [
        (dict(num_steps=1, num_epochs=1), ValueError),
        (dict(num_steps=0), ValueError),
        (dict(num_steps=1.5), ValueError),
        (dict(initial_step=-1, num_steps=1), ValueError),
        (dict(num_epochs=1, steps_per_epoch=11), ValueError),
        (dict(num_epochs=1, grad_accum_steps=11), ValueError),
        (dict(), ValueError),
        (dict(max_steps=5, initial_step=5), RuntimeError),
    ],
)
def test_compute_num_steps_errors(kwargs, error):
    with pytest.raises(error):
        compute_num_steps(list(range(10)), **kwargs)


def test_compute_num_steps_needs_a_length_for_epochs():
    with pytest.raises(ValueError, match="length"):
        compute_num_steps(iter(range(3)), num_epochs=1)


# ------------------------------------------------------------------------ profiler
def test_rate_tracker_reports_rates(cpu_backend):
    executor = DataExecutor(DataLoader(lambda: [torch.zeros(4, 1)] * 3), num_steps=6)
    tracker = None
    for i, _ in enumerate(executor):
        tracker = executor.profiler.rate_tracker
        if i == 0:
            with pytest.raises(RuntimeError):
                tracker.rate
    assert tracker.total_samples == 24
    assert tracker.rate > 0 and tracker.global_rate > 0
    # The first (compiling) step does not count: 5 steps of 4 samples after it.
    assert tracker.global_rate == pytest.approx(20 / tracker.total_time)


def test_rate_tracker_is_ready_for_step_closures(cpu_backend):
    """gigaGPT reads rate and global_rate in a @step_closure from the first step on: the
    values are computed before closures run, and the compiling first step reports 0.0."""
    seen = []

    @cstorch.step_closure
    def log(step):
        tracker = executor.profiler.rate_tracker
        seen.append((step, tracker.rate, tracker.global_rate))

    executor = DataExecutor(DataLoader(lambda: [torch.zeros(4, 1)] * 3), num_steps=4)
    for step, _ in enumerate(executor, start=1):
        log(step)
    assert [s for s, _, _ in seen] == [1, 2, 3, 4]
    assert seen[0][1:] == (0.0, 0.0)
    assert all(rate > 0 and global_rate > 0 for _, rate, global_rate in seen[1:])


def test_rate_tracker_smooths_and_resets(monkeypatch):
    from cstorch.utils import tracker as tracker_module
    from cstorch.utils.profiler import RateTracker

    now = [100.0]
    monkeypatch.setattr(tracker_module.time, "time", lambda: now[0])
    tracker = RateTracker(smooth_factor=0.5)
    tracker.add(10)
    now[0] += 1.0
    assert tracker.rate() == 10.0
    tracker.add(30)
    now[0] += 1.0
    assert tracker.rate() == 0.5 * 30 + 0.5 * 10
    assert tracker.global_rate() == 40 / 2.0
    tracker.reset_time()
    tracker.add(5)
    now[0] += 5.0
    assert tracker.global_rate() == 45 / 5.0  # samples are kept, the clock restarted
    tracker.reset()
    assert tracker.global_rate() == 0.0 and tracker.total_count == 0
    with pytest.raises(ValueError):
        RateTracker(smooth_factor=1.5)
