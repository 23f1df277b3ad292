"""The optional callbacks: metrics, loss checks, flags, selective gradients, parameter counts,
partial checkpoint loading."""

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer import Trainer
from cerebras.modelzoo.trainer.callbacks import (
    Callback,
    CheckLoss,
    Checkpoint,
    CountParams,
    GlobalFlags,
    LoadCheckpointStates,
    ModelEvalMetrics,
    ScopedTrainFlags,
    SelectiveGrad,
    TrainingLoop,
)
from cerebras.modelzoo.trainer.loggers import Logger
from tests.trainer.common import ClassifierMLP, batches, seeded_model, torch_loader

OPT_LEVEL = "csx.precision.optimization_level"


class Collect(Logger):
    def __init__(self):
        self.logged = {}

    def log_metrics(self, metrics, step):
        self.logged.update(metrics)


def make(tmp_path, model=ClassifierMLP, steps=2, callbacks=(), loggers=(), **kwargs):
    return Trainer(
        device="CPU",
        model_dir=tmp_path,
        model=model,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        loop=TrainingLoop(num_steps=steps, eval_frequency=None),
        callbacks=list(callbacks),
        loggers=list(loggers),
        seed=5,
        **kwargs,
    )


class WithAccuracy(ClassifierMLP):
    def __init__(self):
        super().__init__()
        self.accuracy = cstorch.metrics.AccuracyMetric("accuracy")

    def forward(self, batch):
        x, y = batch
        logits = self.fc2(torch.relu(self.fc1(x)))
        if not self.training:
            self.accuracy(labels=y, predictions=logits.argmax(-1))
        return torch.nn.functional.cross_entropy(logits, y)


@pytest.mark.slow
def test_model_eval_metrics_logs_the_accuracy_of_the_validation(tmp_path):
    collect = Collect()
    trainer = make(tmp_path, model=WithAccuracy, callbacks=[ModelEvalMetrics()], loggers=[collect])
    trainer.validate(cstorch.utils.data.DataLoader(torch_loader, 5, 3), ckpt_path=None)
    eager = seeded_model(5)
    with torch.no_grad():
        hits = [
            (eager.fc2(torch.relu(eager.fc1(x))).argmax(-1) == y).float()
            for x, y in batches(5, seed=3)
        ]
    assert collect.logged["validate_0/accuracy"] == pytest.approx(torch.cat(hits).mean().item())


@pytest.mark.slow
def test_check_loss_stops_a_diverging_run(tmp_path):
    class Diverging(ClassifierMLP):
        def forward(self, batch):
            return super().forward(batch) * float("nan")

    trainer = make(tmp_path, model=Diverging, callbacks=[CheckLoss()])
    with pytest.raises(ValueError, match="The loss is nan at global step 1"):
        trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 2))


@pytest.mark.slow
def test_scoped_train_flags_hold_only_while_training(tmp_path):
    seen = []

    class Probe(Callback):
        def on_train_batch_start(self, trainer, model, batch, batch_idx):
            seen.append(cstorch.backends.csx.precision.optimization_level)

    before = cstorch.backends.csx.precision.optimization_level
    other = 2 if before != 2 else 0
    trainer = make(tmp_path, callbacks=[ScopedTrainFlags(**{OPT_LEVEL: other}), Probe()])
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 2))
    assert seen == [other, other]
    assert cstorch.backends.csx.precision.optimization_level == before


def test_global_flags_are_set_at_construction_and_checked(tmp_path):
    before = cstorch.backends.csx.precision.optimization_level
    try:
        make(tmp_path, callbacks=[GlobalFlags(**{OPT_LEVEL: 1})])
        assert cstorch.backends.csx.precision.optimization_level == 1
    finally:
        cstorch.backends.csx.precision.optimization_level = before
    with pytest.raises(ValueError, match="Unknown flag 'csx.precision.no_such_flag'"):
        make(tmp_path / "b", callbacks=[GlobalFlags(**{"csx.precision.no_such_flag": 1})])


@pytest.mark.slow
def test_selective_grad_freezes_the_masked_weights(tmp_path):
    frozen = SelectiveGrad(
        {
            "param_filter": "fc1.weight",
            "init_method": lambda p: torch.zeros_like(p, dtype=torch.bool),
        }
    )
    trainer = make(tmp_path, callbacks=[frozen])
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 2))
    final = trainer.model.state_dict()
    torch.testing.assert_close(final["fc1.weight"], initial["fc1.weight"])
    assert not torch.allclose(final["fc2.weight"], initial["fc2.weight"])
    with pytest.raises(ValueError, match="dict or a list of dicts"):
        SelectiveGrad("fc1.weight")


def test_count_params(tmp_path):
    counter = CountParams()
    make(tmp_path, callbacks=[counter])
    assert counter.total_params == counter.trainable_params == 8 * 16 + 16 + 16 * 4 + 4
    assert [(name, count) for name, _, count in counter.table] == [("fc1", 144), ("fc2", 68)]


@pytest.mark.slow
def test_load_checkpoint_states_restores_only_the_named_states(tmp_path):
    make(tmp_path / "run", steps=3, checkpoint=Checkpoint(steps=3)).fit(
        cstorch.utils.data.DataLoader(torch_loader, 3)
    )
    saved = cstorch.load(str(tmp_path / "run" / "checkpoint_3.mdl"))
    trainer = make(tmp_path / "b", steps=1, callbacks=[LoadCheckpointStates("model")])
    trainer.fit(
        cstorch.utils.data.DataLoader(torch_loader, 1),
        ckpt_path=tmp_path / "run" / "checkpoint_3.mdl",
    )
    assert trainer.global_step == 1  # the step count was not restored, the weights were:
    model = ClassifierMLP()
    model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in saved["model"].items()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(batches(1)[0]).backward()
    optimizer.step()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(trainer.model.state_dict()[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_log_input_summaries_logs_each_steps_batch(tmp_path):
    class Steps(Logger):
        def __init__(self):
            self.inputs = {}

        def log_metrics(self, metrics, step):
            if "input.0" in metrics:
                self.inputs[step] = (metrics["input.0"], metrics["input.1"])

    from cerebras.modelzoo.trainer.callbacks import LogInputSummaries

    steps = Steps()
    make(tmp_path, steps=3, callbacks=[LogInputSummaries()], loggers=[steps]).fit(
        cstorch.utils.data.DataLoader(torch_loader, 3)
    )
    assert sorted(steps.inputs) == [1, 2, 3]
    for step, (x, y) in enumerate(batches(3), start=1):
        torch.testing.assert_close(steps.inputs[step][0], x)
        torch.testing.assert_close(steps.inputs[step][1], y)
