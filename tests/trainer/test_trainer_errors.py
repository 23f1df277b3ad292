"""Every argument error of the Trainer and of its core callbacks."""

import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer import Trainer
from cerebras.modelzoo.trainer.callbacks import (
    Checkpoint,
    Logging,
    MixedPrecision,
    TrainingLoop,
    ValidationLoop,
)
from cerebras.modelzoo.trainer.loggers import ProgressLogger
from tests.trainer.common import ClassifierMLP, torch_loader


def build(tmp_path, **kwargs):
    kwargs.setdefault("model_dir", tmp_path)
    kwargs.setdefault("model", ClassifierMLP)
    return Trainer(**kwargs)


def test_device_and_backend_together_are_rejected_even_when_they_match(tmp_path):
    backend = cstorch.backend("CPU")
    with pytest.raises(ValueError, match="backend and device are mutually exclusive"):
        build(tmp_path, device="CPU", backend=backend)


def test_neither_device_nor_backend(tmp_path):
    with pytest.raises(RuntimeError, match="Trainer expected a backend object or a device string"):
        build(tmp_path)


def test_unknown_device_string(tmp_path):
    with pytest.raises(ValueError, match="Invalid device type: 'TPU'"):
        build(tmp_path, device="TPU")


def test_backend_must_be_a_cstorch_backend(tmp_path):
    with pytest.raises(TypeError, match="cstorch.backend.Backend"):
        build(tmp_path, backend="CPU")


def test_device_strings_are_case_insensitive_and_share_the_backend(tmp_path):
    first = build(tmp_path / "a", device="cpu")
    second = build(tmp_path / "b", device="Cpu")
    assert first.backend is second.backend and first.backend.is_cpu
    assert second.backend.artifact_dir == str(second.artifact_dir)


def test_trainers_with_different_device_types(tmp_path):
    build(tmp_path / "a", device="CPU")
    with pytest.raises(
        ValueError, match="Cannot instantiate multiple trainers with different device types"
    ):
        build(tmp_path / "b", device="CSX")


def test_a_given_backend_is_used(tmp_path):
    backend = cstorch.backend("CPU")
    trainer = build(tmp_path, backend=backend)
    assert trainer.backend is backend
    assert backend.artifact_dir == str(trainer.artifact_dir)
    assert trainer.artifact_dir.parent == tmp_path / "cerebras_logs"
    assert (tmp_path / "cerebras_logs" / "latest").resolve() == trainer.artifact_dir.resolve()


@pytest.mark.parametrize(
    "core", [TrainingLoop(num_steps=1), Checkpoint(), Logging(), ValidationLoop(), MixedPrecision()]
)
def test_a_core_callback_passed_as_a_user_callback(tmp_path, core):
    with pytest.raises(
        ValueError,
        match=f"Callback {type(core).__name__} is a core callback and cannot be overridden",
    ):
        build(tmp_path, device="CPU", callbacks=[core])


def test_loggers_must_be_loggers(tmp_path):
    with pytest.raises(TypeError, match="logger must be an instance of Logger"):
        build(tmp_path, device="CPU", loggers=[object()])


def test_a_logger_passed_as_a_callback_only_warns(tmp_path):
    with pytest.warns(UserWarning, match="pass it in loggers= instead"):
        build(tmp_path, device="CPU", callbacks=[ProgressLogger()])


def test_model_dir_and_model_are_required(tmp_path):
    with pytest.raises(ValueError, match="model_dir is a required argument"):
        Trainer(device="CPU", model=ClassifierMLP)
    with pytest.raises(ValueError, match="model is a required argument"):
        Trainer(device="CPU", model_dir=tmp_path)


def test_a_model_factory_needs_an_optimizer_factory(tmp_path):
    cstorch.backend("CPU")
    optimizer = cstorch.optim.SGD(ClassifierMLP().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="pass optimizer as a function that takes the model"):
        build(tmp_path, device=None, backend=cstorch.backend(), optimizer=optimizer)


def test_built_objects_are_accepted(tmp_path):
    cstorch.backend("CPU")
    model = ClassifierMLP()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = cstorch.optim.lr_scheduler.ConstantLR(optimizer, learning_rate=0.1)
    trainer = build(
        tmp_path, backend=cstorch.backend(), model=model, optimizer=optimizer, schedulers=scheduler
    )
    assert trainer.model is model and trainer.optimizer is optimizer
    assert trainer.schedulers == [scheduler]


@pytest.mark.parametrize(
    "argument, value, kind",
    [
        ("precision", "bf16", TypeError),
        ("loop", object(), TypeError),
        ("checkpoint", 12, TypeError),
        ("logging", "INFO", TypeError),
    ],
)
def test_core_arguments_must_have_their_type(tmp_path, argument, value, kind):
    with pytest.raises(kind, match=argument):
        build(tmp_path, device="CPU", **{argument: value})


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_a_seed_out_of_torchs_range_is_named(tmp_path, seed):
    # torch.manual_seed says only "Overflow when unpacking long long" (issue 31, item 9)
    with pytest.raises(
        ValueError,
        match=r"seed: must be an integer from -2\*\*63 to "
        r"2\*\*64 - 1 .*got " + str(seed),
    ):
        build(tmp_path, device="CPU", seed=seed)


def test_factories_must_return_the_right_objects(tmp_path):
    with pytest.raises(TypeError, match="must return a torch.nn.Module") as info:
        build(tmp_path, device="CPU", model=lambda: "not a module")
    assert "raised by ModelCallback.setup" in info.value.__notes__[0]
    with pytest.raises(TypeError, match="must return a cstorch.optim.Optimizer"):
        build(tmp_path / "b", device="CPU", optimizer=lambda model: None)


def test_fit_needs_an_optimizer_and_a_cstorch_dataloader(tmp_path):
    trainer = build(tmp_path, device="CPU", loop=TrainingLoop(num_steps=1))
    with pytest.raises(RuntimeError, match="OptimizerCallback.on_fit_start") as info:
        trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 1))
    assert "fit needs an optimizer" in str(info.value.__cause__)
    with pytest.raises(TypeError, match="cstorch.utils.data.DataLoader"):
        trainer.validate(torch_loader(1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_steps": 0}, "`num_steps` must be greater than 0"),
        ({"max_steps": -3}, "`max_steps` must be greater than 0"),
        ({"num_steps": 2, "num_epochs": 1}, "mutually exclusive"),
        ({"num_steps": 2, "eval_frequency": 1.5}, "eval_frequency"),
        ({"num_steps": 2, "eval_steps": 0}, "`eval_steps` must be greater than 0"),
    ],
)
def test_training_loop_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainingLoop(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps": -1}, "non-negative integer"),
        ({"checkpoint_name": "ckpt.mdl"}, "exactly once"),
        ({"checkpoint_name": "ckpt_{step}_{epoch}.mdl"}, "exactly once"),
        ({"checkpoint_name": "ckpt_{step:6d}.mdl"}, "which names step 0 'ckpt_     0.mdl'"),
        ({"checkpoint_name": "ckpt_{step:x}.mdl"}, "which names step 12 'ckpt_c.mdl'"),
        ({"checkpoint_name": "ckpt_{step:,}.mdl"}, "which names step 1000 'ckpt_1,000.mdl'"),
        ({"checkpoint_name": "run/ckpt_{step}.mdl"}, "which names step 0 'run/ckpt_0.mdl'"),
        ({"checkpoint_name": "ckpt_{step!r}.mdl"}, "exactly once"),
        ({"checkpoint_name": "ckpt_{step"}, "exactly once"),
    ],
)
def test_checkpoint_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Checkpoint(**kwargs)


@pytest.mark.slow
def test_a_checkpoint_name_with_a_padded_step_saves_and_resumes(tmp_path):
    """``checkpoint_name: ckpt_{step:06d}.mdl`` names ckpt_000002.mdl, and the next fit finds
    it (every fit used to fail at the lookup with "not enough values to unpack") (issue 49,
    item 2)."""
    sgd = lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1)  # noqa: E731
    for total in (2, 4):
        trainer = build(
            tmp_path,
            device="CPU",
            optimizer=sgd,
            loop=TrainingLoop(num_steps=2),
            checkpoint=Checkpoint(steps=2, checkpoint_name="ckpt_{step:06d}.mdl"),
        )
        trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 2))
        assert trainer.global_step == total  # the second fit resumed from step 2
    assert sorted(p.name for p in tmp_path.glob("*.mdl")) == ["ckpt_000002.mdl", "ckpt_000004.mdl"]
    assert [p.name for p in trainer.checkpoint.get_all_checkpoints()] == [
        "ckpt_000002.mdl",
        "ckpt_000004.mdl",
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_gradient_norm": 1.0, "max_gradient_value": 1.0}, "not both"),
        ({"max_gradient_norm": -1.0}, "positive"),
        ({"fp16_type": "float8"}, "fp16_type"),
        ({"loss_scaling_factor": "static"}, "loss_scaling_factor"),
    ],
)
def test_mixed_precision_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MixedPrecision(**kwargs)


def test_missing_checkpoint_file(tmp_path):
    trainer = build(
        tmp_path,
        device="CPU",
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        loop=TrainingLoop(num_steps=1),
    )
    with pytest.raises(FileNotFoundError, match="does not exist"):
        trainer.fit(
            cstorch.utils.data.DataLoader(torch_loader, 1), ckpt_path=tmp_path / "missing.mdl"
        )


def test_model_without_a_loss_output(tmp_path):
    class NoLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, batch):
            return {"logits": self.fc(batch[0])}

    trainer = build(
        tmp_path,
        device="CPU",
        model=NoLoss,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        loop=TrainingLoop(num_steps=1),
    )
    with pytest.raises(RuntimeError, match="ModelCallback.on_before_backward") as info:
        trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 1))
    assert "'loss' key" in str(info.value.__cause__)


def test_gradient_accumulation_is_refused_on_cpu(tmp_path):
    with pytest.raises(NotImplementedError, match="gradients do not persist"):
        build(tmp_path, device="CPU", loop=TrainingLoop(num_steps=4, grad_accum_steps=2))


@pytest.mark.slow
def test_an_autoloaded_checkpoint_of_another_model_names_the_file_and_the_ways_out(tmp_path):
    """A model_dir reused for a different model: the Trainer autoloads the old run's newest
    checkpoint. The error names that file, the shapes and both ways out, instead of
    "Encountered error when calling ModelCallback.on_load_checkpoint" (issue 31, item 5)."""
    sgd = lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1)  # noqa: E731
    build(
        tmp_path,
        device="CPU",
        optimizer=sgd,
        loop=TrainingLoop(num_steps=2),
        checkpoint=Checkpoint(steps=2),
    ).fit(cstorch.utils.data.DataLoader(torch_loader, 2))
    stale = tmp_path / "checkpoint_2.mdl"
    assert stale.exists()
    trainer = build(
        tmp_path,
        device="CPU",
        model=lambda: ClassifierMLP(hidden=7),
        optimizer=sgd,
        loop=TrainingLoop(num_steps=2),
    )
    with pytest.raises(RuntimeError) as info:
        trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 2))
    message = str(info.value)
    assert f"The newest checkpoint in model_dir, {stale}, does not fit this model" in message
    assert "torch.Size([16, 8]) from checkpoint" in message  # the two shapes
    assert "use a new model_dir" in message
    assert "autoload_last_checkpoint: false" in message
    assert "Encountered error" not in message
    # The second way out works: start from the initial weights.
    trainer = build(
        tmp_path,
        device="CPU",
        model=lambda: ClassifierMLP(hidden=7),
        optimizer=sgd,
        loop=TrainingLoop(num_steps=1),
        checkpoint=Checkpoint(autoload_last_checkpoint=False),
    )
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 1))
    assert trainer.global_step == 1


def test_a_data_processor_typo_in_the_python_api_is_a_plain_type_error(tmp_path):
    trainer = build(
        tmp_path,
        device="CPU",
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        loop=TrainingLoop(num_steps=1),
    )
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'") as info:
        trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 1, batchsize=3))
    assert "Encountered error" not in str(info.value)


def test_the_initial_checkpoint_holds_the_initial_weights(tmp_path):
    # Its checkpoint closure is called before the loop's executor exists: it runs at once.
    trainer = build(
        tmp_path,
        device="CPU",
        seed=3,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
        loop=TrainingLoop(num_steps=2),
        checkpoint=Checkpoint(steps=2, save_initial_checkpoint=True),
    )
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 2))
    assert {p.name for p in tmp_path.glob("*.mdl")} == {"checkpoint_0.mdl", "checkpoint_2.mdl"}
    from tests.trainer.common import seeded_model

    initial = seeded_model(3).state_dict()
    saved = cstorch.load(str(tmp_path / "checkpoint_0.mdl"))["model"]
    for name, value in initial.items():
        torch.testing.assert_close(torch.as_tensor(saved[name]), value)
    assert not torch.equal(
        torch.as_tensor(cstorch.load(str(tmp_path / "checkpoint_2.mdl"))["model"]["fc1.weight"]),
        initial["fc1.weight"],
    )
