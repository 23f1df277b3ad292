"""The exact order in which the Trainer calls its hooks, and the dispatcher's rules."""

import pytest

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer import Trainer
from cerebras.modelzoo.trainer.callbacks import Callback, Checkpoint, TrainingLoop, ValidationLoop
from cerebras.modelzoo.trainer.trainer import STANDARD_HOOKS
from tests.trainer.common import ClassifierMLP, torch_loader


def _recording(name):
    def hook(self, trainer, *args, **kwargs):
        self.calls.append(name)

    return hook


# A callback that implements every hook by recording its name.
HookRecorder = type(
    "HookRecorder",
    (Callback,),
    {"calls": None, **{name: _recording(name) for name in STANDARD_HOOKS if name != "finalize"}},
)

TRAIN_STEP = [  # trace-time hooks: they run once, while the training step is captured
    "on_train_step_start",
    "on_before_forward",
    "on_after_forward",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_after_optimizer_step",
    "on_before_optimizer_zero_grad",
    "on_after_optimizer_zero_grad",
    "on_before_scheduler_step",
    "on_after_scheduler_step",
    "on_train_step_end",
]
VALIDATE_STEP = [
    "on_validate_step_start",
    "on_before_forward",
    "on_after_forward",
    "on_validate_step_end",
]


def validation(step_hooks=()):
    return [
        "on_enter_validate",
        "on_before_load_checkpoint",
        "on_validate_start",
        "on_validate_batch_start",
        *step_hooks,
        "on_validate_batch_end",
        "on_validate_end",
    ]


def make(tmp_path):
    recorder = HookRecorder()
    recorder.calls = []
    trainer = Trainer(
        device="CPU",
        model_dir=tmp_path,
        model=ClassifierMLP,
        optimizer=lambda model: cstorch.optim.SGD(model.parameters(), lr=0.1),
        schedulers=lambda optimizer: cstorch.optim.lr_scheduler.LinearLR(
            optimizer, initial_learning_rate=0.1, end_learning_rate=0.0, total_iters=2
        ),
        loop=TrainingLoop(num_steps=2, eval_frequency=1, eval_steps=1),
        checkpoint=Checkpoint(steps=2),
        callbacks=[recorder],
    )
    return trainer, recorder


@pytest.mark.slow
def test_hook_order_of_construction_fit_validate_and_validate_all(tmp_path):
    trainer, recorder = make(tmp_path)
    assert recorder.calls == ["pre_setup", "setup", "post_setup"]

    recorder.calls = []
    val_loader = cstorch.utils.data.DataLoader(torch_loader, 1, 5)
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 2), val_loader)
    upstream_validation = ["on_enter_validate_all", "on_before_load_checkpoint"]
    assert recorder.calls == [
        "on_enter_fit",
        "on_before_load_checkpoint",
        "on_fit_start",
        # training loop 0 (one step), compiling the training step
        "on_enter_train",
        "on_train_start",
        "on_train_batch_start",
        *TRAIN_STEP,
        "on_train_batch_end",
        "on_train_end",
        *upstream_validation,
        *validation(VALIDATE_STEP),
        "run_validation",
        # training loop 1: the compiled step runs, the last step saves a checkpoint
        "on_enter_train",
        "on_train_start",
        "on_train_batch_start",
        "on_train_batch_end",
        "on_save_checkpoint",
        "postprocess_checkpoint",
        "on_after_save_checkpoint",
        "on_train_end",
        *upstream_validation,
        *validation(),
        "run_validation",
        "on_fit_end",
    ]

    recorder.calls = []
    trainer.validate(val_loader, ckpt_path=None)
    assert recorder.calls == validation()

    recorder.calls = []
    trainer.validate_all(val_loader, ckpt_paths=[str(tmp_path / "checkpoint_2.mdl")])
    assert recorder.calls == [
        "on_enter_validate_all",
        "on_before_load_checkpoint",
        "preprocess_checkpoint",
        "on_load_checkpoint",
        *validation(),
        "run_validation",
    ]


def test_validate_on_a_fresh_trainer_traces_the_validation_step(tmp_path):
    trainer, recorder = make(tmp_path)
    recorder.calls = []
    trainer.validate(
        cstorch.utils.data.DataLoader(torch_loader, 2), ckpt_path=None, loop=ValidationLoop()
    )  # all (2) batches
    assert recorder.calls == [
        "on_enter_validate",
        "on_before_load_checkpoint",
        "on_validate_start",
        "on_validate_batch_start",
        *VALIDATE_STEP,
        "on_validate_batch_end",
        "on_validate_batch_start",
        "on_validate_batch_end",
        "on_validate_end",
    ]


def test_a_custom_validation_hook_renames_the_loop_hooks(tmp_path):
    class Probe(Callback):
        def __init__(self):
            self.calls = []

        def on_probe_start(self, trainer, model, val_dataloader, loop):
            self.calls.append("on_probe_start")
            assert not model.training

        def on_probe_batch_end(self, trainer, model, outputs, batch, batch_idx):
            self.calls.append("on_probe_batch_end")

        def on_probe_end(self, trainer, model, loop):
            self.calls.append("on_probe_end")

    probe = Probe()
    trainer = Trainer(device="CPU", model_dir=tmp_path, model=ClassifierMLP, callbacks=[probe])
    trainer.validate(
        cstorch.utils.data.DataLoader(torch_loader, 2),
        ckpt_path=None,
        loop=ValidationLoop(hook="probe"),
    )
    assert probe.calls == [
        "on_probe_start",
        "on_probe_batch_end",
        "on_probe_batch_end",
        "on_probe_end",
    ]
    assert trainer.non_standard_hooks_whitelist == set()  # only while the loop runs


def test_errors_in_hooks_name_the_callback_and_run_exception_hooks(tmp_path):
    class Broken(Callback):
        def __init__(self):
            self.seen = []

        def on_train_batch_start(self, trainer, model, batch, batch_idx):
            raise ValueError("boom")

        def on_train_exception(self, trainer, exception):
            self.seen.append(("train", type(exception)))

        def on_fit_exception(self, trainer, exception):
            self.seen.append(("fit", type(exception)))

    broken = Broken()
    trainer = Trainer(
        device="CPU",
        model_dir=tmp_path,
        model=ClassifierMLP,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        loop=TrainingLoop(num_steps=2),
        callbacks=[broken],
    )
    with pytest.raises(
        RuntimeError, match="Encountered error when calling Broken.on_train_batch_start"
    ) as info:
        trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 2))
    assert isinstance(info.value.__cause__, ValueError)
    assert str(info.value).endswith(": ValueError: boom")  # the cause in the last line
    assert broken.seen == [("train", RuntimeError), ("fit", RuntimeError)]


def test_global_callbacks_see_every_trainer_only_inside_their_block(tmp_path):
    trainer, _ = make(tmp_path)
    loader = cstorch.utils.data.DataLoader(torch_loader, 1)
    spy = HookRecorder()
    spy.calls = []
    with spy:
        trainer.validate(loader, ckpt_path=None)
    assert spy.calls[0] == "on_enter_validate" and spy.calls[-1] == "on_validate_end"
    count = len(spy.calls)
    trainer.validate(loader, ckpt_path=None)
    assert len(spy.calls) == count


def test_a_callback_missing_a_hook_is_an_error(tmp_path):
    class NotACallback:
        pass

    with pytest.raises(TypeError, match="Expected each callback to be a Callback"):
        Trainer(device="CPU", model_dir=tmp_path, model=ClassifierMLP, callbacks=[NotACallback()])


def test_downstream_validation_callbacks_run_after_each_upstream_validation(tmp_path):
    from cerebras.modelzoo.trainer.callbacks import ValidationCallback

    class Downstream(ValidationCallback):
        name_scope = "downstream"
        every_n_vals = 1
        num_validate_loops = 1

        def __init__(self):
            self.runs = []

        def run_validation(self, trainer, loop_idx, is_last):
            self.runs.append((trainer.global_step, loop_idx, is_last))

    downstream = Downstream()
    trainer = Trainer(
        device="CPU",
        model_dir=tmp_path,
        model=ClassifierMLP,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        loop=TrainingLoop(num_steps=5, eval_frequency=2, eval_steps=1),
        callbacks=[downstream],
    )
    assert trainer.validation_callbacks == [downstream]
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 5))
    # Training loops of 2, 2 and 1 steps, each followed by validation.
    assert downstream.runs == [(2, 0, False), (4, 1, False), (5, 2, True)]
    trainer.validate_all(None, ckpt_paths=None)
    assert downstream.runs[-1] == (5, None, True)
