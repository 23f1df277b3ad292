"""Loggers: TensorBoard event files read back by tensorboard itself; console progress lines."""

import io
import re
import warnings

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer import Trainer
from cerebras.modelzoo.trainer.callbacks import (
    Callback,
    ComputeNorm,
    Logging,
    LogOptimizerParamGroup,
    TrainingLoop,
)
from cerebras.modelzoo.trainer.loggers import Logger, ProgressLogger, TensorBoardLogger
from tests.trainer.common import ClassifierMLP, torch_loader


class Collect(Logger):
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))


def fit(tmp_path, loggers, callbacks=(), log_steps=1, num_steps=6):
    trainer = Trainer(
        device="CPU",
        model_dir=tmp_path,
        model=ClassifierMLP,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        schedulers=lambda o: cstorch.optim.lr_scheduler.LinearLR(
            o, initial_learning_rate=0.1, end_learning_rate=0.0, total_iters=num_steps
        ),
        loop=TrainingLoop(num_steps=num_steps, eval_frequency=num_steps // 2, eval_steps=2),
        logging=Logging(log_steps=log_steps),
        loggers=loggers,
        callbacks=list(callbacks),
        seed=3,
    )
    trainer.fit(
        cstorch.utils.data.DataLoader(torch_loader, num_steps),
        cstorch.utils.data.DataLoader(torch_loader, 2, 7),
    )
    return trainer


def scalars(accumulator, tag):
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


@pytest.mark.slow
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


@pytest.mark.slow
def test_log_steps_and_metrics_from_inside_the_step(tmp_path):
    collect = Collect()
    fit(tmp_path, [collect], [LogOptimizerParamGroup("lr"), ComputeNorm()], log_steps=2)
    train = [(step, m) for step, m in collect.logged if "loss" in m]
    assert [step for step, _ in train] == [2, 4, 6]  # every 2nd step
    lrs = {step: float(m["lr/0"]) for step, m in collect.logged if "lr/0" in m}
    # The LR the optimizer used at step k (1-based) is 0.1 * (1 - (k - 1) / 6): logged
    # from inside the compiled step, each value is its own step's.
    assert lrs == pytest.approx({2: 0.1 * 5 / 6, 4: 0.1 * 3 / 6, 6: 0.1 * 1 / 6})
    norms = [
        float(m["model_wise_grad_norm"]) for _, m in collect.logged if "model_wise_grad_norm" in m
    ]
    assert len(norms) == 3 and all(n > 0 for n in norms) and len(set(norms)) == 3


def test_progress_logger_writes_plain_lines_when_not_a_terminal(tmp_path):
    out = io.StringIO()
    trainer = fit(tmp_path, [ProgressLogger(stream=out)], num_steps=4)
    lines = out.getvalue().splitlines()
    assert all("\r" not in line and "\033" not in line for line in lines)
    # the run header: the device, the precision, the model's size (ClassifierMLP: 8*16 + 16
    # + 16*4 + 4 parameters), the fit's steps and the batch size
    assert lines[0] == (
        "run: device CPU (1 x cpu) | precision float32 | 212 parameters | 4 steps | batch 4"
    )
    assert lines[1] == "compiling the training step (capture and XLA compile)..."
    # the global step of the fit's total, with the loss; the first step's time (the compile),
    # then from the second step of a loop on the steady rate and the time left
    steps = [line for line in lines if line.startswith("train ")]
    assert [line.split(" | ")[0] for line in steps] == [f"train {i}/4" for i in (1, 2, 3, 4)]
    assert re.fullmatch(
        r"train 1/4 \| loss \d\.\d{4} \| first step \d+\.\d s \(compiling\)", steps[0]
    )
    assert re.fullmatch(
        r"train 2/4 \| loss \d\.\d{4} \| [\d,]+\.\d samples/s \| ETA \d+:\d\d", steps[1]
    )
    assert re.fullmatch(
        r"train 4/4 \| loss \d\.\d{4} \| [\d,]+\.\d samples/s \| took \d+:\d\d", steps[3]
    )
    assert "compiling the validation step (capture and XLA compile)..." in lines
    results = [line for line in lines if "validate_0/loss" in line and "done" not in line]
    assert [line.split(" | ")[0] for line in results] == ["step 2", "step 4"]
    summary = lines[-1]
    assert summary.startswith("fit done at global step 4 in ")
    assert re.search(
        r"\| compiling \d+\.\d s \| training [\d,]+\.\d samples/s \| loss \d\.\d{4} "
        r"\| validate_0/loss \d\.\d{4} \|",
        summary,
    ), summary
    log_file = trainer.artifact_dir / "run.log"
    assert summary.endswith(f"log {log_file}")
    logged = log_file.read_text()
    for line in lines:  # every console line is in the run log, with the trainer's records
        assert line in logged
    assert "INFO: No checkpoint found" in logged


def test_log_records_never_break_the_bar(tmp_path):
    import logging as _logging

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()

    class Chatty(Callback):
        def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
            announce(trainer)

    @cstorch.step_closure
    def announce(trainer):
        _logging.getLogger("cerebras.modelzoo.trainer").info("a record")
        warnings.warn("a warning")

    handler = _logging.StreamHandler(out)
    root = _logging.getLogger()
    root.addHandler(handler)
    try:
        with warnings.catch_warnings():  # (restores showwarning)
            warnings.simplefilter("always")
            warnings.showwarning = lambda message, *args, **kwargs: out.write(f"W: {message}\n")
            fit(tmp_path, [ProgressLogger(stream=out)], [Chatty()], num_steps=2)
    finally:
        root.removeHandler(handler)
    text = out.getvalue()
    # each record and warning starts on a cleared line and ends its line; the bar follows
    for message in ("a record", "W: a warning"):
        pieces = text.split(message)
        assert len(pieces) == 3  # logged at both steps
        assert all(before.endswith("\r\033[K") for before in pieces[:-1])  # on a cleared line
        assert all(after.startswith("\n\r\033[K") for after in pieces[1:])  # then the bar
    assert "train [" in text


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
    trainer = Trainer(
        device="CPU",
        model_dir=tmp_path,
        model=Summarizing,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        loop=TrainingLoop(num_steps=3, eval_frequency=None),
        loggers=[collect],
    )
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
    trainer = Trainer(
        device="CPU",
        model_dir=tmp_path,
        model=ClassifierMLP,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        loggers=[ProgressLogger(stream=out)],
    )  # default loop: one epoch
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 4))
    frames = out.getvalue().split("\r\033[K")
    bars = [f for f in frames if f.startswith("train [")]
    assert bars[0].startswith("train [" + "=" * 6 + " " * 18 + "] 1/4 | loss ")
    assert bars[-1].startswith("train [" + "=" * 24 + "] 4/4 | loss ")
    assert "samples/s" in bars[-1] and "took" in bars[-1]
    assert frames[-1].split("\n")[1].startswith("fit done at global step 4")  # below the bar
    assert frames[-1].endswith("\n")


def test_the_trainer_turns_off_the_executor_bar(tmp_path):
    # The ProgressLogger shows the whole fit in global steps; the data executors' own bars
    # (which count within each segment between validations) stay off.
    seen = []

    class Look(Callback):
        def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
            seen.append(trainer.executor.show_progress)

        def on_validate_batch_end(self, trainer, model, outputs, batch, batch_idx):
            seen.append(trainer.executor.show_progress)

    fit(tmp_path, [], [Look()], num_steps=2)
    assert seen and not any(seen)


def test_tensorboard_gets_lr_gradient_norm_and_throughput_by_default(tmp_path):
    # A Trainer built in Python with no callbacks logs what the YAML path logs by default
    # (and the HF Trainer always): read back from the event file, against eager torch.
    from tests.trainer.common import batches, seeded_model

    steps, lr = 4, 0.1
    board = TensorBoardLogger()
    trainer = Trainer(
        device="CPU",
        model_dir=tmp_path,
        model=ClassifierMLP,
        seed=3,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=lr),
        schedulers=lambda o: cstorch.optim.lr_scheduler.LinearLR(
            o, initial_learning_rate=lr, end_learning_rate=0.0, total_iters=steps
        ),
        loop=TrainingLoop(num_steps=steps),
        loggers=[board],
    )
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, steps))
    board.finalize()
    accumulator = EventAccumulator(str(trainer.summary_dir))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"loss", "lr/0", "model_wise_grad_norm", "avg_samples_per_sec"} <= tags, tags

    # eager torch: the same model, batches and schedule; the global norm of each step's grads
    model = seeded_model(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    want_norms, want_lrs = [], []
    for step, batch in enumerate(batches(steps)):
        optimizer.param_groups[0]["lr"] = lr * (1 - step / steps)
        want_lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.zero_grad()
        model(batch).backward()
        want_norms.append(torch.sqrt(sum((p.grad**2).sum() for p in model.parameters())).item())
        optimizer.step()
    norms = scalars(accumulator, "model_wise_grad_norm")
    assert [s for s, _ in norms] == [1, 2, 3, 4]
    np.testing.assert_allclose([v for _, v in norms], want_norms, rtol=1e-5)
    np.testing.assert_allclose([v for _, v in scalars(accumulator, "lr/0")], want_lrs, rtol=1e-6)
    # samples per second after the compiling first step: logged from the second step on
    rates = scalars(accumulator, "avg_samples_per_sec")
    assert [s for s, _ in rates] == [2, 3, 4] and all(v > 0 for _, v in rates)


def test_callbacks_empty_logs_only_the_losses(tmp_path):
    collect = Collect()
    fit(tmp_path, [collect], [], num_steps=2)
    assert {name for _, m in collect.logged for name in m} == {"loss", "validate_0/loss"}
