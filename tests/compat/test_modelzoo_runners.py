"""The Model Zoo 1.x runner system (``modelzoo.common.pytorch``): hook order, both command
lines, runconfig validation, checkpoints (naming, autoload, eval_all), compile-only, the
modeled wafer, and per-step parity with eager torch."""

import os
import warnings

import pytest
import torch

import cstorch
from cstorch.core.compile import RecompilationWarning
from modelzoo.common.pytorch.pytorch_runner import PyTorchRunner
from modelzoo.common.pytorch.run_utils import run, run_with_params
from tests.compat import toy_zoo
from tests.lanes import marked_cases

HOST_HOOKS = [
    "on_train_start",
    "on_train_end",
    "on_eval_start",
    "on_eval_end",
    "on_train_epoch_start",
    "on_train_epoch_end",
    "on_eval_epoch_start",
    "on_eval_epoch_end",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_eval_batch_start",
    "on_eval_batch_end",
    "on_checkpoint_saved",
]
TRACED = [
    "optimizer_zero_grad",
    "train_forward",
    "backward",
    "optimizer_step",
    "lr_scheduler_step",
    "eval_forward",
]


def _recording(base):
    """A custom runner (the docs' "Creating Custom PyTorch Runners") that records its hooks
    and the train losses it sees in on_train_batch_end."""

    def make(name):
        def hook(self, *args, **kwargs):
            self.calls.append(name)
            if name == "on_train_batch_end":
                self.losses.append(float(args[0]))
            return getattr(base, name)(self, *args, **kwargs)

        return hook

    attrs = {name: make(name) for name in HOST_HOOKS + TRACED}

    def __init__(self, *args, **kwargs):
        self.calls, self.losses = [], []
        base.__init__(self, *args, **kwargs)

    attrs["__init__"] = __init__
    return type(f"Recording{base.__name__}", (base,), attrs)


RecordingRunner = _recording(PyTorchRunner)


def _run(params, runner_cls=RecordingRunner):
    created = []

    class Capture(runner_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self)

    run_with_params(
        params, toy_zoo.ToyModel, toy_zoo.train_data_fn, toy_zoo.eval_data_fn, runner_cls=Capture
    )
    return created[0]


STEP = ["on_train_batch_start", "on_train_batch_end"]
FIRST_STEP = [
    "on_train_batch_start",
    "optimizer_zero_grad",
    "train_forward",
    "backward",
    "optimizer_step",
    "lr_scheduler_step",
    "on_train_batch_end",
]
EVAL = (
    ["on_eval_epoch_start", "on_eval_batch_start", "eval_forward", "on_eval_batch_end"]
    + ["on_eval_batch_start", "on_eval_batch_end"] * 2
    + ["on_eval_epoch_end"]
)
EVAL_AGAIN = (
    ["on_eval_epoch_start"]
    + ["on_eval_batch_start", "on_eval_batch_end"] * 3
    + ["on_eval_epoch_end"]
)

# (mode, runconfig, expected hook order). Step-internal methods are traced: they appear when
# the step is compiled; host hooks appear for every batch. Switching the model back to a mode
# (train_and_eval) reuses that mode's program, so only the first epoch traces its steps.
HOOK_ORDER_CASES = [
    (
        "train",
        {"max_steps": 3},
        ["on_train_start", "on_train_epoch_start"]
        + FIRST_STEP
        + STEP * 2
        + ["on_train_epoch_end", "on_train_end"],
    ),
    (
        "train",
        {"max_steps": 4, "checkpoint_steps": 2},
        ["on_train_start", "on_train_epoch_start"]
        + FIRST_STEP
        + STEP
        + ["on_checkpoint_saved"]
        + STEP * 2
        + ["on_checkpoint_saved", "on_train_epoch_end", "on_train_end"],
    ),
    ("eval", {}, ["on_eval_start"] + EVAL + ["on_eval_end"]),
    (
        "train_and_eval",
        {"max_steps": 8, "steps_per_epoch": 4},
        ["on_train_start", "on_train_epoch_start"]
        + FIRST_STEP
        + STEP * 3
        + ["on_train_epoch_end"]
        + EVAL
        + ["on_train_epoch_start"]
        + STEP * 4
        + ["on_train_epoch_end"]
        + EVAL_AGAIN
        + ["on_train_end"],
    ),
]


@pytest.mark.parametrize(
    "mode,runconfig,expected",
    marked_cases(
        HOOK_ORDER_CASES,
        ids=[f"{c[0]}-{i}" for i, c in enumerate(HOOK_ORDER_CASES)],
        slow={"train-0"},
    ),
)
def test_hook_order(tmp_path, mode, runconfig, expected):
    params = toy_zoo.make_params(tmp_path, mode=mode, **runconfig)
    with warnings.catch_warnings():  # switching between train and eval reuses each program
        warnings.simplefilter("error", RecompilationWarning)
        runner = _run(params)
    assert runner.calls == expected


@pytest.mark.slow
def test_grad_accumulation_calls_batch_start_per_micro_batch(tmp_path):
    params = toy_zoo.make_params(tmp_path, max_steps=2)
    params["optimizer"]["grad_accum_steps"] = 3
    runner = _run(params)
    assert runner.calls == (
        ["on_train_start", "on_train_epoch_start"]
        + ["on_train_batch_start"] * 3
        + ["optimizer_zero_grad"]
        + ["train_forward", "backward"] * 3
        + ["optimizer_step", "lr_scheduler_step", "on_train_batch_end"]
        + ["on_train_batch_start"] * 3
        + ["on_train_batch_end", "on_train_epoch_end", "on_train_end"]
    )


def _rel_err(actual, expected):
    return max(abs(a - e) / abs(e) for a, e in zip(actual, expected))


PARITY_CASES = [
    ("sgd", {}, None),
    (
        "accumulation-clipping-schedule",
        {
            "grad_accum_steps": 2,
            "max_gradient_norm": 0.5,
            "learning_rate": [
                {
                    "scheduler": "Linear",
                    "initial_learning_rate": 0.0,
                    "end_learning_rate": 0.2,
                    "steps": 3,
                },
                {"scheduler": "Constant", "learning_rate": 0.05},
            ],
        },
        lambda t: 0.2 * t / 3 if t < 3 else 0.05,
    ),
    ("dynamic-loss-scaling", {"loss_scaling_factor": "dynamic"}, None),
]


@pytest.mark.parametrize("name,optimizer,lr_fn", PARITY_CASES, ids=[c[0] for c in PARITY_CASES])
@pytest.mark.slow
def test_per_step_losses_match_eager_torch(tmp_path, name, optimizer, lr_fn):
    params = toy_zoo.make_params(tmp_path, max_steps=9)
    params["optimizer"].update(optimizer)
    runner = _run(params)
    expected, _ = toy_zoo.eager_losses(params, 9, lr_fn)
    assert len(runner.losses) == 9
    assert _rel_err(runner.losses, expected) < 1e-4


@pytest.mark.slow
def test_checkpoints_autoload_resume_and_eval_all(tmp_path):
    params = toy_zoo.make_params(tmp_path, max_steps=4, checkpoint_steps=2)
    first = _run(params)
    names = sorted(os.listdir(tmp_path))
    assert {"checkpoint_2.mdl", "checkpoint_4.mdl"} <= set(names)
    state = cstorch.load(str(tmp_path / "checkpoint_4.mdl"))
    assert state["global_step"] == 4 and state["state_version"] == 0.2
    assert {"model", "optimizer"} <= set(state)

    # A new run with a higher max_steps autoloads checkpoint_4 and continues at step 5.
    cstorch.backend._reset_for_tests()
    params = toy_zoo.make_params(tmp_path, max_steps=6, checkpoint_steps=2)
    second = _run(params)
    assert len(second.losses) == 2
    # A new run starts its data from the first batch again (1.x dataloaders hold no state).
    expected, eager_model = toy_zoo.eager_losses(params, 6, order=[0, 1, 2, 3, 0, 1])
    assert _rel_err(first.losses + second.losses, expected) < 1e-4
    assert (tmp_path / "checkpoint_6.mdl").exists()

    # eval_all: one evaluation per checkpoint, by increasing step; the last one's loss is
    # the eager model's mean eval loss.
    cstorch.backend._reset_for_tests()
    params = toy_zoo.make_params(tmp_path, mode="eval_all")
    created = []

    class Capture(PyTorchRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self)

    results = run_with_params(
        params, toy_zoo.ToyModel, None, toy_zoo.eval_data_fn, runner_cls=Capture
    )
    assert [os.path.basename(p) for p in results] == [
        "checkpoint_2.mdl",
        "checkpoint_4.mdl",
        "checkpoint_6.mdl",
    ]
    eager_model.eval()
    with torch.no_grad():
        eval_losses = [eager_model(b).item() for b in toy_zoo.eval_data_fn(params)]
    assert list(results.values())[-1] == pytest.approx(sum(eval_losses) / 3, rel=1e-4)


@pytest.mark.slow
def test_checkpoint_path_and_pretrained(tmp_path):
    params = toy_zoo.make_params(tmp_path / "a", max_steps=2, checkpoint_steps=2)
    _run(params)
    cstorch.backend._reset_for_tests()
    # A pretrained checkpoint loads the weights only: training restarts at step 0.
    params = toy_zoo.make_params(
        tmp_path / "b",
        max_steps=3,
        is_pretrained_checkpoint=True,
        checkpoint_path=str(tmp_path / "a" / "checkpoint_2.mdl"),
    )
    runner = _run(params)
    assert len(runner.losses) == 3 and runner._global_step == 3
    cstorch.backend._reset_for_tests()
    params = toy_zoo.make_params(tmp_path / "c", checkpoint_path=str(tmp_path / "missing.mdl"))
    with pytest.raises(FileNotFoundError, match="missing.mdl"):
        _run(params)


def test_runconfig_validation_errors(tmp_path):
    params = toy_zoo.make_params(tmp_path, max_stepz=3)
    with pytest.raises(ValueError, match=r"Unknown runconfig key 'max_stepz'.*max_steps"):
        _run(params)
    params = toy_zoo.make_params(tmp_path, max_steps="3")
    with pytest.raises(ValueError, match=r"runconfig.max_steps must be of type integer"):
        _run(params)
    params = toy_zoo.make_params(tmp_path, compile_only=True, validate_only=True)
    with pytest.raises(ValueError, match="one of compile_only and validate_only"):
        _run(params)
    params = toy_zoo.make_params(tmp_path)
    del params["model"]["mixed_precision"]
    with pytest.raises(ValueError, match="mixed_precision"):
        _run(params)
    params = toy_zoo.make_params(tmp_path, max_steps=None)
    with pytest.raises(ValueError, match="max_steps"):
        _run(params)
    params = toy_zoo.make_params(tmp_path, seed=2**70)  # torch: "Overflow when unpacking"
    with pytest.raises(
        ValueError,
        match=r"runconfig.seed must be an integer from -2\*\*63 "
        r"to 2\*\*64 - 1",
    ):
        _run(params)


def test_a_params_mistake_on_the_command_line_exits_2_naming_the_key(tmp_path, capsys):
    """As argparse does for the command line itself: one line on stderr, exit status 2,
    nothing built (issue 31, item 9)."""
    yaml_path = _write_params(tmp_path / "p.yaml", seed=2**70)
    with pytest.raises(SystemExit) as info:
        _run_cli(["CPU", "--params", yaml_path, "--mode", "train", "-o", str(tmp_path / "md")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: runconfig.seed must be an integer from -2**63 to 2**64 - 1" in err, err
    assert not (tmp_path / "md" / "train").exists()


def test_a_yaml_tag_in_a_params_file_is_refused_with_the_reason(tmp_path, capsys):
    """A 1.x params file is plain YAML: a tag (``!!python/...``) is refused saying so, in
    one line, with nothing run or built (it was yaml's ConstructorError traceback)
    (issue 49, item 5)."""
    from modelzoo.common.pytorch.utils import read_params_file

    marker = tmp_path / "MARKER"
    path = tmp_path / "p.yaml"
    path.write_text(
        f"runconfig: {{max_steps: 4}}\n"
        f"train_input: !!python/object/apply:os.system ['touch {marker}']\n"
    )
    reason = (
        r"YAML tags are not allowed \(`!!python/object/apply:os.system`\), line 2: a "
        r"params file is plain YAML"
    )
    with pytest.raises(ValueError, match=rf"^Params file {path}: {reason}"):
        read_params_file(str(path))
    with pytest.raises(SystemExit) as info:
        _run_cli(["CPU", "--params", str(path), "--mode", "train", "-o", str(tmp_path / "md")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: Params file {path}: YAML tags are not allowed" in err, err
    assert "Traceback" not in err and not marker.exists()
    assert not (tmp_path / "md").exists()


def _write_params(path, **runconfig):
    import yaml

    params = toy_zoo.make_params("unused")
    params["runconfig"] = {"max_steps": 4, "log_steps": 1, "seed": 1, **runconfig}
    path.write_text(yaml.safe_dump(params))
    return str(path)


def _run_cli(argv, runner_cls=RecordingRunner):
    created = []

    class Capture(runner_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self)

    run(
        toy_zoo.ToyModel, toy_zoo.train_data_fn, toy_zoo.eval_data_fn, argv=argv, runner_cls=Capture
    )
    return created[0]


@pytest.mark.slow
def test_both_command_lines_and_cli_overrides(tmp_path):
    yaml_path = _write_params(tmp_path / "p.yaml", checkpoint_steps=4)
    model_dir = tmp_path / "model_dir"
    runner = _run_cli(["CPU", "--params", yaml_path, "--mode", "train", "-o", str(model_dir)])
    assert runner._runconfig["target_device"] == "CPU" and len(runner.losses) == 4
    assert (model_dir / "checkpoint_4.mdl").exists()
    assert (model_dir / "train" / "params_train.yaml").exists()
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(model_dir / "train"))

    # 1.7: flags only; --max_steps on the command line overrides the YAML; resumes at 5.
    cstorch.backend._reset_for_tests()
    runner = _run_cli(
        ["-p", yaml_path, "-m", "train", "-cpu", "-o", str(model_dir), "--max_steps", "6"]
    )
    assert runner._runconfig["cpu"] is True and runner._runconfig["max_steps"] == 6
    assert len(runner.losses) == 2 and (model_dir / "checkpoint_6.mdl").exists()
    expected, _ = toy_zoo.eager_losses(
        toy_zoo.make_params(model_dir, max_steps=6), 6, order=[0, 1, 2, 3, 0, 1]
    )
    assert _rel_err(runner.losses, expected[4:]) < 1e-4

    with pytest.raises(SystemExit):  # argparse: the two are mutually exclusive
        _run_cli(
            [
                "CSX",
                "weight_streaming",
                "-p",
                yaml_path,
                "-m",
                "train",
                "--compile_only",
                "--validate_only",
            ]
        )
    with pytest.raises(RuntimeError, match="--checkpoint_path"):
        _run_cli(["CPU", "-p", yaml_path, "-m", "train", "--is_pretrained_checkpoint"])
    with pytest.raises(SystemExit):
        _run_cli(["CPU", "-p", yaml_path, "-m", "fit"])


def test_yaml_settings_of_another_device_are_dropped(tmp_path):
    from modelzoo.common.run_utils.cli_parser import get_params_from_args

    yaml_path = _write_params(tmp_path / "p.yaml", num_csx=2, mount_dirs=["/a"])
    params = get_params_from_args(str(tmp_path), ["CPU", "-p", yaml_path, "-m", "eval"])
    assert "num_csx" not in params["runconfig"] and "mount_dirs" not in params["runconfig"]
    params = get_params_from_args(
        str(tmp_path),
        ["CSX", "weight_streaming", "-p", yaml_path, "-m", "eval", "--mount_dirs", "/b"],
    )
    rc = params["runconfig"]
    assert rc["num_csx"] == 2 and rc["mount_dirs"] == ["/b", "/a"]
    assert rc["model_dir"] == os.path.join(str(tmp_path), "model_dir")


@pytest.mark.slow
def test_compile_only_writes_artifacts_and_trains_nothing(tmp_path):
    params = toy_zoo.make_params(
        tmp_path, target_device="CSX", compile_only=True, checkpoint_steps=1
    )
    from modelzoo.common.pytorch.pytorch_cs_compiler import PyTorchCSCompiler

    created = []

    class Capture(PyTorchCSCompiler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self)

    torch.manual_seed(1)
    initial = toy_zoo.ToyModel(params).state_dict()
    run_with_params(
        params, toy_zoo.ToyModel, toy_zoo.train_data_fn, toy_zoo.eval_data_fn, runner_cls=Capture
    )
    compile_dir = tmp_path / "cerebras_compile"
    assert sorted(os.listdir(compile_dir)) == [
        "train_step.cost_analysis.json",
        "train_step.jaxpr.txt",
        "train_step.stablehlo.mlir",
    ]
    assert "stablehlo" in (compile_dir / "train_step.stablehlo.mlir").read_text()
    assert not any(name.endswith(".mdl") for name in os.listdir(tmp_path))
    for name, value in created[0]._model.model.state_dict().items():
        assert torch.equal(value, initial[name]), name  # nothing trained


def test_csx_trains_on_the_modeled_wafer_and_refuses_train_and_eval(tmp_path):
    from modelzoo.common.pytorch.pytorch_cs_appliance import PyTorchCSAppliance

    params = toy_zoo.make_params(tmp_path, target_device="CSX", max_steps=4)
    runner = _run(params, _recording(PyTorchCSAppliance))
    assert cstorch.backend().is_csx
    expected, _ = toy_zoo.eager_losses(params, 4)
    assert _rel_err(runner.losses, expected) < 1e-2  # mixed precision on the wafer
    params = toy_zoo.make_params(tmp_path, target_device="CSX", mode="train_and_eval")
    with pytest.raises(RuntimeError, match="train_and_eval is not supported on a Cerebras"):
        _run(params, _recording(PyTorchCSAppliance))


def test_custom_runner_must_fit_the_target(tmp_path):
    from modelzoo.common.pytorch.pytorch_cs_appliance import PyTorchCSAppliance

    params = toy_zoo.make_params(tmp_path)
    with pytest.raises(TypeError, match="subclass of PyTorchRunner"):
        _run(params, PyTorchCSAppliance)


@pytest.mark.slow
def test_experimental_api_flow_matches_eager_torch(tmp_path):
    from modelzoo.common.pytorch.run_cstorch_flow import run_cstorch_flow

    params = toy_zoo.make_params(tmp_path, max_steps=6, experimental_api=True, checkpoint_steps=3)
    losses = run_with_params(params, toy_zoo.ToyModel, toy_zoo.train_data_fn)
    expected, _ = toy_zoo.eager_losses(params, 6)
    assert _rel_err(losses, expected) < 1e-4
    assert (tmp_path / "checkpoint_6.mdl").exists()
    assert run_cstorch_flow  # the flow the params route to


@pytest.mark.slow
def test_nan_loss_is_reported(tmp_path):
    params = toy_zoo.make_params(tmp_path, max_steps=3)
    params["optimizer"]["learning_rate"] = 1e30
    with pytest.raises(ValueError, match="NaN loss|inf loss"):
        _run(params)


def _uneven_train_data(params):
    data = toy_zoo.train_data_fn(params)
    return data[:3] + [(data[3][0][:5], data[3][1][:5])]  # a smaller last batch


@pytest.mark.slow
def test_changing_graph_is_refused_on_csx_and_allowed_on_cpu(tmp_path):
    params = toy_zoo.make_params(tmp_path / "cpu", max_steps=4)
    with (
        pytest.warns(UserWarning, match="Batch size changed"),
        pytest.warns(RecompilationWarning, match="input shapes"),
    ):
        run_with_params(params, toy_zoo.ToyModel, _uneven_train_data)
    cstorch.backend._reset_for_tests()
    params = toy_zoo.make_params(tmp_path / "csx", max_steps=4, target_device="CSX")
    with pytest.raises(RuntimeError, match="drop_last=True"):
        run_with_params(params, toy_zoo.ToyModel, _uneven_train_data)


def test_replaced_create_with_the_documented_signature_runs_the_custom_runner(
    tmp_path, monkeypatch
):
    """1.x docs: a custom runner is used by changing ``PyTorchBaseRunner.create(model_fn,
    params)``; ``run`` must call it with exactly those two arguments and use its runner."""
    from modelzoo.common.pytorch.pytorch_base_runner import PyTorchBaseRunner

    stock, created = PyTorchBaseRunner.create, []

    def create(model_fn, params):  # the documented signature, nothing more
        runner = stock(model_fn, params, runner_cls=RecordingRunner)
        created.append(runner)
        return runner

    monkeypatch.setattr(PyTorchBaseRunner, "create", staticmethod(create))
    params = toy_zoo.make_params(tmp_path, max_steps=3)
    run_with_params(params, toy_zoo.ToyModel, toy_zoo.train_data_fn, toy_zoo.eval_data_fn)
    assert len(created) == 1
    expected, _ = toy_zoo.eager_losses(params, 3)
    assert _rel_err(created[0].losses, expected) < 1e-4


def test_choosing_the_1x_half_dtype_before_the_backend_keeps_the_wafers_mixed_precision():
    """The 1.x ``use_bfloat16`` picks the half dtype only: set before ``cstorch.backend("CSX")``
    it must not turn the wafer's default mixed precision off (it read the flag and wrote it
    back, which made a choice of float32)."""
    from cstorch.backend import precision
    from cstorch.distributed import ClusterConfig
    from modelzoo.common.pytorch.half_dtype import half_dtype_instance as instance

    instance.use_bfloat16 = True
    cstorch.backend("CSX", cluster_config=ClusterConfig(num_csx=1))
    assert precision.mixed_precision() and precision.get_half_dtype_str() == "bfloat16"
    assert instance.half_dtype is torch.bfloat16
