"""The Trainer's fit, validation, checkpoints and resume against eager torch."""

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer import Trainer
from cerebras.modelzoo.trainer.callbacks import Callback, Checkpoint, TrainingLoop
from tests.trainer.common import (
    END_LR,
    LR,
    MOMENTUM,
    ClassifierMLP,
    batches,
    eager_reference,
    torch_loader,
)

SEED = 1234


class Recorder(Callback):
    """Records the loss of every step (through a step closure) and where runs start."""

    def __init__(self):
        self.train_losses, self.val_losses, self.fit_start_steps = [], [], []
        self.loaded = []

    def on_fit_start(self, trainer, train_dataloader, val_dataloader, loop):
        self.fit_start_steps.append(trainer.global_step)

    def on_before_load_checkpoint(self, trainer, ckpt_path):
        self.loaded.append(ckpt_path)

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        self.record("train_losses", outputs["loss"])

    def on_validate_batch_end(self, trainer, model, outputs, batch, batch_idx):
        self.record("val_losses", outputs["loss"])

    @cstorch.step_closure
    def record(self, kind, loss):  # (closure arguments are copied: pass names, not lists)
        getattr(self, kind).append(loss.item())


def make_trainer(model_dir, loop, recorder, checkpoint=None, device="CPU"):
    return Trainer(
        device=device,
        model_dir=model_dir,
        model=ClassifierMLP,
        optimizer=lambda model: cstorch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
        schedulers=[
            lambda optimizer: cstorch.optim.lr_scheduler.LinearLR(
                optimizer, initial_learning_rate=LR, end_learning_rate=END_LR, total_iters=24
            )
        ],
        loop=loop,
        checkpoint=checkpoint or Checkpoint(steps=12),
        callbacks=[recorder],
        seed=SEED,
    )


@pytest.mark.slow
def test_fit_matches_eager_torch_and_writes_checkpoints(tmp_path):
    recorder = Recorder()
    trainer = make_trainer(
        tmp_path / "run", TrainingLoop(num_steps=24, eval_frequency=12, eval_steps=3), recorder
    )
    trainer.fit(
        cstorch.utils.data.DataLoader(torch_loader, 24),
        cstorch.utils.data.DataLoader(torch_loader, 3, 99),
    )

    val = batches(3, seed=99)
    want_train, want_val, want_state = eager_reference(SEED, batches(24), val, eval_every=12)
    np.testing.assert_allclose(recorder.train_losses, want_train, rtol=1e-4)
    mean_val = [np.mean(recorder.val_losses[:3]), np.mean(recorder.val_losses[3:])]
    np.testing.assert_allclose(mean_val, want_val, rtol=1e-4)
    assert trainer.global_step == 24
    assert trainer.training_step.trace_count == 1  # one program, reused after validating

    assert sorted(p.name for p in (tmp_path / "run").glob("*.mdl")) == [
        "checkpoint_12.mdl",
        "checkpoint_24.mdl",
    ]
    saved = cstorch.load(str(tmp_path / "run" / "checkpoint_24.mdl"))
    assert saved["global_step"] == 24
    for name, value in want_state.items():
        np.testing.assert_allclose(
            np.asarray(saved["model"][name]), value.numpy(), rtol=1e-4, atol=1e-6
        )
    assert set(saved) >= {"model", "optimizer", "schedulers", "global_step"}


@pytest.mark.slow
def test_a_second_trainer_resumes_from_a_checkpoint(tmp_path):
    first = Recorder()
    make_trainer(tmp_path / "run", TrainingLoop(num_steps=24, eval_frequency=None), first).fit(
        cstorch.utils.data.DataLoader(torch_loader, 24)
    )

    # Resume explicitly from step 12, feeding the batches that step 13 onwards saw.
    second = Recorder()
    trainer = make_trainer(
        tmp_path / "resumed", TrainingLoop(num_steps=12, eval_frequency=None), second
    )
    trainer.fit(
        cstorch.utils.data.DataLoader(torch_loader, 12, 0, 12),
        ckpt_path=tmp_path / "run" / "checkpoint_12.mdl",
    )
    assert second.fit_start_steps == [12]
    np.testing.assert_allclose(second.train_losses, first.train_losses[12:], rtol=1e-5)
    assert [p.name for p in (tmp_path / "resumed").glob("*.mdl")] == ["checkpoint_24.mdl"]

    # By default a trainer picks up the latest checkpoint in its model directory.
    third = Recorder()
    make_trainer(tmp_path / "run", TrainingLoop(num_steps=2, eval_frequency=None), third).fit(
        cstorch.utils.data.DataLoader(torch_loader, 24)
    )
    assert third.loaded == [tmp_path / "run" / "checkpoint_24.mdl"]
    assert third.fit_start_steps == [24]
    assert (tmp_path / "run" / "checkpoint_26.mdl").exists()


@pytest.mark.slow
def test_validate_and_validate_all_report_the_eager_validation_loss(tmp_path):
    recorder = Recorder()
    trainer = make_trainer(
        tmp_path / "run", TrainingLoop(num_steps=24, eval_frequency=None), recorder
    )
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 24))
    assert recorder.val_losses == []  # eval_frequency=None: no validation during fit

    val_loader = cstorch.utils.data.DataLoader(torch_loader, 3, 99)
    trainer.validate(val_loader, ckpt_path=None)
    _, _, state = eager_reference(SEED, batches(24))
    model = ClassifierMLP()
    model.load_state_dict(state)
    with torch.no_grad():
        want = [model(b).item() for b in batches(3, seed=99)]
    np.testing.assert_allclose(recorder.val_losses, want, rtol=1e-4)

    # validate_all over both checkpoints: the step-12 weights give a different loss.
    recorder.val_losses.clear()
    trainer.validate_all(val_loader, ckpt_paths=[str(tmp_path / "run" / "checkpoint_*.mdl")])
    assert [p for p in recorder.loaded if p][-2:] == [
        tmp_path / "run" / "checkpoint_12.mdl",
        tmp_path / "run" / "checkpoint_24.mdl",
    ]
    np.testing.assert_allclose(recorder.val_losses[3:], want, rtol=1e-4)
    assert not np.allclose(recorder.val_losses[:3], want, rtol=1e-4)
    with pytest.raises(FileNotFoundError, match="not found"):
        trainer.validate_all(val_loader, ckpt_paths=str(tmp_path / "nothing_*.mdl"))


@pytest.mark.slow
def test_fit_with_validation_on_csx_compiles_each_step_once(tmp_path):
    recorder = Recorder()
    trainer = make_trainer(
        tmp_path / "run",
        TrainingLoop(num_steps=8, eval_frequency=4, eval_steps=2),
        recorder,
        device="CSX",
    )
    trainer.fit(
        cstorch.utils.data.DataLoader(torch_loader, 8),
        cstorch.utils.data.DataLoader(torch_loader, 2, 99),
    )
    assert trainer.backend.is_csx
    assert len(recorder.train_losses) == 8 and len(recorder.val_losses) == 4
    assert all(np.isfinite(recorder.train_losses))
    assert trainer.training_step.trace_count == 1
    # The wafer runs mixed precision: close to, not bitwise equal to, fp32 eager losses.
    want, _, _ = eager_reference(SEED, batches(8))
    np.testing.assert_allclose(recorder.train_losses, want, rtol=1e-3)


@pytest.mark.slow
def test_training_loops_continue_the_data_stream_across_epochs(tmp_path):
    # 4 batches per epoch, validation every 4 steps: each training loop ends exactly at the
    # end of an epoch, and the next one starts the next epoch.
    recorder = Recorder()
    trainer = make_trainer(
        tmp_path, TrainingLoop(num_steps=10, eval_frequency=4, eval_steps=1), recorder
    )
    trainer.fit(
        cstorch.utils.data.DataLoader(torch_loader, 4),
        cstorch.utils.data.DataLoader(torch_loader, 1, 99),
    )
    epochs = batches(4) * 3
    want, _, _ = eager_reference(SEED, epochs[:10])
    np.testing.assert_allclose(recorder.train_losses, want, rtol=1e-4)
    assert len(recorder.val_losses) == 3  # after steps 4, 8 and 10


def test_training_continues_the_data_after_each_validation(tmp_path):
    """A deliberate difference from the reference Model Zoo Trainer, which restarts the
    training data after each validation (repeating its first batches): here training goes on
    with the next batch. 6 batches, validation every 4 steps, 8 steps: batches 0-3, then
    4, 5, 0, 1 (the reference: 0-3, 0-3)."""
    recorder = Recorder()
    trainer = make_trainer(
        tmp_path, TrainingLoop(num_steps=8, eval_frequency=4, eval_steps=1), recorder
    )
    trainer.fit(
        cstorch.utils.data.DataLoader(torch_loader, 6),
        cstorch.utils.data.DataLoader(torch_loader, 1, 99),
    )
    data = batches(6)
    want, _, _ = eager_reference(SEED, (data * 2)[:8])
    np.testing.assert_allclose(recorder.train_losses, want, rtol=1e-4)
    restarted, _, _ = eager_reference(SEED, data[:4] * 2)
    assert abs(recorder.train_losses[4] - restarted[4]) > 1e-3  # not the replayed batch 0


class RestartableBatches:
    """A restartable dataloader (cstorch's protocol): it remembers how many batches it has
    handed out, and a checkpoint stores that position."""

    def __init__(self, num_batches):
        self.data = batches(num_batches)
        self.position = 0

    def __iter__(self):
        while self.position < len(self.data):
            self.position += 1
            yield self.data[self.position - 1]
        self.position = 0

    def __len__(self):
        return len(self.data)

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state_dict):
        self.position = state_dict["position"]

    def aggregate_state_dict(self, worker_states):
        return worker_states[0]

    def deaggregate_state_dict(self, aggregated_state_dict):
        return aggregated_state_dict


@pytest.mark.slow
def test_a_restartable_dataloader_resumes_where_the_checkpoint_was_taken(tmp_path):
    first = Recorder()
    make_trainer(
        tmp_path / "run", TrainingLoop(num_steps=8, eval_frequency=None), first, Checkpoint(steps=4)
    ).fit(cstorch.utils.data.DataLoader(RestartableBatches, 12))
    saved = cstorch.load(str(tmp_path / "run" / "checkpoint_4.mdl"))
    assert saved["dataloader"] == {"position": 4}

    resumed = Recorder()
    make_trainer(tmp_path / "resumed", TrainingLoop(num_steps=4, eval_frequency=None), resumed).fit(
        cstorch.utils.data.DataLoader(RestartableBatches, 12),
        ckpt_path=tmp_path / "run" / "checkpoint_4.mdl",
    )
    np.testing.assert_allclose(resumed.train_losses, first.train_losses[4:], rtol=1e-5)


@pytest.mark.slow
def test_checkpoints_of_another_version_are_refused_unless_not_strict(tmp_path):
    make_trainer(tmp_path / "run", TrainingLoop(num_steps=2, eval_frequency=None), Recorder()).fit(
        cstorch.utils.data.DataLoader(torch_loader, 2)
    )
    state = cstorch.load(str(tmp_path / "run" / "checkpoint_2.mdl"))
    assert state["__metadata__"] == [{"version": cstorch.__version__}]
    state["__metadata__"] = [{"version": "1.9.1"}]
    cstorch.save(state, str(tmp_path / "old.mdl"))

    trainer = make_trainer(
        tmp_path / "a", TrainingLoop(num_steps=1, eval_frequency=None), Recorder()
    )
    with pytest.raises(RuntimeError, match="Checkpoint.preprocess_checkpoint") as info:
        trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 1), ckpt_path=tmp_path / "old.mdl")
    assert "version 1.9.1" in str(info.value.__cause__)
    lenient = make_trainer(
        tmp_path / "b",
        TrainingLoop(num_steps=1, eval_frequency=None),
        Recorder(),
        Checkpoint(strict_version=False),
    )
    with pytest.warns(UserWarning, match="version 1.9.1"):
        lenient.fit(cstorch.utils.data.DataLoader(torch_loader, 1), ckpt_path=tmp_path / "old.mdl")
    assert lenient.global_step == 3


@pytest.mark.slow
def test_a_compile_only_run_takes_one_step_and_saves_nothing(tmp_path):
    recorder = Recorder()
    trainer = Trainer(
        backend=cstorch.backend("CSX", compile_only=True),
        model_dir=tmp_path,
        model=ClassifierMLP,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        loop=TrainingLoop(num_steps=10, eval_frequency=5),
        checkpoint=Checkpoint(steps=5),
        callbacks=[recorder],
    )
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 10))
    assert trainer.global_step == 1 and len(recorder.train_losses) == 1
    assert recorder.loaded == []  # no checkpoint is even looked for
    assert list(tmp_path.glob("*.mdl")) == []
