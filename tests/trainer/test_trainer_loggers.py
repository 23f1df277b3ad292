"""Loggers: TensorBoard event files read back by tensorboard itself; console progress lines."""

import io

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer import Trainer
from cerebras.modelzoo.trainer.callbacks import (
    ComputeNorm, LogOptimizerParamGroup, Logging, TrainingLoop)
from cerebras.modelzoo.trainer.loggers import Logger, ProgressLogger, TensorBoardLogger

from tests.trainer.common import ClassifierMLP, torch_loader


class Collect(Logger):
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))


def fit(tmp_path, loggers, callbacks=(), log_steps=1, num_steps=6):
    trainer = Trainer(
        device="CPU", model_dir=tmp_path, model=ClassifierMLP,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        schedulers=lambda o: cstorch.optim.lr_scheduler.LinearLR(
            o, initial_learning_rate=0.1, end_learning_rate=0.0, total_iters=num_steps),
        loop=TrainingLoop(num_steps=num_steps, eval_frequency=num_steps // 2, eval_steps=2),
        logging=Logging(log_steps=log_steps), loggers=loggers, callbacks=list(callbacks),
        seed=3)
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, num_steps),
                cstorch.utils.data.DataLoader(torch_loader, 2, 7))
    return trainer


def scalars(accumulator, tag):
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def test_tensorboard_event_files_hold_the_logged_scalars(tmp_path):
    collect, board = Collect(), TensorBoardLogger()
    trainer = fit(tmp_path, [collect, board])
    board.finalize()

    accumulator = EventAccumulator(str(trainer.summary_dir))
    accumulator.Reload()
    train = [(step, m["loss"]) for step, m in collect.logged if "loss" in m]
    val = [(step, m["validate_0/loss"]) for step, m in collect.logged if "validate_0/loss" in m]
    assert [s for s, _ in train] == [1, 2, 3, 4, 5, 6] and [s for s, _ in val] == [3, 6]
    for tag, want in (("loss", train), ("validate_0/loss", val)):
        got = scalars(accumulator, tag)
        assert [s for s, _ in got] == [s for s, _ in want]
        np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-6)


def test_log_steps_and_metrics_from_inside_the_step(tmp_path):
    collect = Collect()
    fit(tmp_path, [collect], [LogOptimizerParamGroup("lr"), ComputeNorm()], log_steps=2)
    train = [(step, m) for step, m in collect.logged if "loss" in m]
    assert [step for step, _ in train] == [2, 4, 6]  # every 2nd step
    lrs = {step: float(m["lr/0"]) for step, m in collect.logged if "lr/0" in m}
    # The LR the optimizer used at step k (1-based) is 0.1 * (1 - (k - 1) / 6): logged
    # from inside the compiled step, each value is its own step's.
    assert lrs == pytest.approx({2: 0.1 * 5 / 6, 4: 0.1 * 3 / 6, 6: 0.1 * 1 / 6})
    norms = [float(m["model_wise_grad_norm"]) for _, m in collect.logged
             if "model_wise_grad_norm" in m]
    assert len(norms) == 3 and all(n > 0 for n in norms) and len(set(norms)) == 3


def test_progress_logger_writes_plain_lines_when_not_a_terminal(tmp_path):
    out = io.StringIO()
    fit(tmp_path, [ProgressLogger(stream=out)], num_steps=2)
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["step 1", "step 1", "step 2", "step 2"]
    assert "loss=" in lines[0] and "validate_0/loss=" in lines[1]
    assert all("samples/s" in line and "\r" not in line for line in lines)


def test_log_metrics_without_loggers_and_to_named_destinations(tmp_path):
    a, b = Collect(), type("Other", (Collect,), {})()
    trainer = Trainer(device="CPU", model_dir=tmp_path, model=ClassifierMLP, loggers=[a, b])
    trainer.log_metrics_dict({"x": 1.0}, step=5, dest="Other")
    assert a.logged == [] and b.logged == [(5, {"x": 1.0})]
    with trainer.name_scope("outer"), trainer.name_scope("inner"):
        trainer.log_metrics(y=2.0)
    assert a.logged == [(0, {"outer/inner/y": 2.0})]
    with pytest.warns(UserWarning, match="None of the loggers matched"):
        trainer.log_metrics_dict({"x": 1.0}, dest="Nobody")




def test_summarize_scalar_from_inside_the_model_logs_each_steps_value(tmp_path):
    from cerebras.modelzoo.trainer import summarize_scalar

    class Summarizing(ClassifierMLP):
        def forward(self, batch):
            loss = super().forward(batch)
            summarize_scalar("twice_loss", loss * 2)
            return loss

    collect = Collect()
    trainer = Trainer(device="CPU", model_dir=tmp_path, model=Summarizing,
                      optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
                      loop=TrainingLoop(num_steps=3, eval_frequency=None), loggers=[collect])
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 3))
    twice = {step: float(m["twice_loss"]) for step, m in collect.logged if "twice_loss" in m}
    loss = {step: float(m["loss"]) for step, m in collect.logged if "loss" in m}
    assert sorted(twice) == [1, 2, 3]
    assert twice == pytest.approx({step: 2 * value for step, value in loss.items()})
    with pytest.raises(RuntimeError, match="needs a running Trainer"):
        summarize_scalar("x", 1.0)


def test_progress_logger_draws_a_bar_on_a_terminal(tmp_path):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    trainer = Trainer(device="CPU", model_dir=tmp_path, model=ClassifierMLP,
                      optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
                      loggers=[ProgressLogger(stream=out)])  # default loop: one epoch
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 4))
    frames = out.getvalue().split("\r\033[K")
    assert frames[1].startswith("[" + "=" * 6 + " " * 18 + "] 1/4 step 1 | loss=")
    assert frames[-1].startswith("[" + "=" * 24 + "] 4/4 step 4 | loss=")
    assert out.getvalue().endswith("\n")
