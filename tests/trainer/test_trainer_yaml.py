"""The ``trainer:`` YAML: validation errors, legacy conversion, and the command line on CPU
and CSX, checked against the eager-torch training of the same config."""

import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cerebras.modelzoo.trainer.callbacks import CheckLoss, KeepNCheckpoints, RateProfiler
from cerebras.modelzoo.trainer.config import TrainerConfigError, validate_trainer_params
from cerebras.modelzoo.trainer.legacy import convert_legacy_params_to_trainer_params
from cerebras.modelzoo.trainer.loggers import TensorBoardLogger
from cerebras.modelzoo.trainer.registry import register_data_processor, register_model
from cerebras.modelzoo.trainer.utils import run_trainer
from tests import fork_server
from tests.paths import REPO
from tests.trainer.common import ClassifierMLP, batches, eager_reference, torch_loader

SEED = 7


def params(model_dir, device="CPU"):
    return {
        "trainer": {
            "init": {
                "device": device,
                "model_dir": str(model_dir),
                "seed": SEED,
                "model": {"name": "tests.trainer.common:ClassifierMLP"},
                "optimizer": {"SGD": {"lr": 0.1, "momentum": 0.9}},
                "schedulers": [
                    {
                        "LinearLR": {
                            "initial_learning_rate": 0.1,
                            "end_learning_rate": 0.01,
                            "total_iters": 24,
                        }
                    }
                ],
                "loop": {"num_steps": 24, "eval_frequency": 12, "eval_steps": 3},
                "checkpoint": {"steps": 12},
                "loggers": [{"ProgressLogger": None}],  # keep test output quiet; TensorBoard stays
            },
            "fit": {
                "train_dataloader": {
                    "data_processor": "tests.trainer.common:torch_loader",
                    "num_batches": 24,
                },
                "val_dataloader": {
                    "data_processor": "tests.trainer.common:torch_loader",
                    "num_batches": 3,
                    "seed": 99,
                },
            },
            "validate": {
                "val_dataloader": {
                    "data_processor": "tests.trainer.common:torch_loader",
                    "num_batches": 3,
                    "seed": 99,
                }
            },
        }
    }


def logged(model_dir, tag):
    (summary,) = [p for p in model_dir.iterdir() if p.is_dir() and p.name[0].isdigit()]
    accumulator = EventAccumulator(str(summary))
    accumulator.Reload()
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


def run_cli(tmp_path, config, *args):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return fork_server.run(
        [sys.executable, "-m", "cerebras.modelzoo.trainer", "fit", str(path), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )


@pytest.mark.parametrize("device, rtol", [("CPU", 1e-4), ("CSX", 1e-3)])
@pytest.mark.slow
def test_the_command_line_fits_like_eager_torch(tmp_path, device, rtol):
    model_dir = tmp_path / "model_dir"
    result = run_cli(tmp_path, params(model_dir), "--device", device)
    assert result.returncode == 0, result.stderr[-3000:]
    want_train, want_val, _ = eager_reference(SEED, batches(24), batches(3, seed=99), eval_every=12)
    train = logged(model_dir, "loss")
    assert [step for step, _ in train] == list(range(1, 25))
    np.testing.assert_allclose([v for _, v in train], want_train, rtol=rtol)
    val = logged(model_dir, "validate_0/loss")
    assert [step for step, _ in val] == [12, 24]
    np.testing.assert_allclose([v for _, v in val], want_val, rtol=rtol)
    assert {p.name for p in model_dir.glob("*.mdl")} == {"checkpoint_12.mdl", "checkpoint_24.mdl"}


@pytest.mark.slow
def test_run_trainer_in_process_with_registered_names(tmp_path):
    register_model("TinyMLP")(ClassifierMLP)
    register_data_processor("TinyData")(torch_loader)
    config = params(tmp_path / "run")
    init, fit = config["trainer"]["init"], config["trainer"]["fit"]
    init["model"] = {"name": "TinyMLP", "hidden": 16}
    init["loop"] = {"num_steps": 4, "eval_frequency": None}
    init["callbacks"] = [{"CheckLoss": None}, {"KeepNCheckpoints": {"n": 1}}]
    init["checkpoint"] = {"steps": 2}
    fit["train_dataloader"] = {"data_processor": "TinyData", "num_batches": 4}
    (trainer,) = run_trainer("fit", config)
    assert trainer.global_step == 4
    assert trainer.get_callback(CheckLoss) is None  # a default removed with a null entry
    assert trainer.get_callback(RateProfiler) is not None  # the other defaults stay
    assert trainer.get_callback(KeepNCheckpoints).n == 1
    assert [type(logger) for logger in trainer.loggers] == [TensorBoardLogger]
    assert [p.name for p in (tmp_path / "run").glob("*.mdl")] == ["checkpoint_4.mdl"]
    want, _, _ = eager_reference(SEED, batches(4))
    np.testing.assert_allclose([v for _, v in logged(tmp_path / "run", "loss")], want, rtol=1e-4)

    (validator,) = run_trainer("eval", config)  # autoloads checkpoint_4 from model_dir
    assert validator.global_step == 4

    # validate_all without ckpt_paths: every checkpoint of the model directory.
    config["trainer"]["validate_all"] = {
        "val_dataloaders": config["trainer"]["validate"]["val_dataloader"]
    }
    (all_validator,) = run_trainer("eval_all", config)
    assert all_validator.global_step == 4
    (tmp_path / "run" / "checkpoint_4.mdl").unlink()
    with pytest.raises(FileNotFoundError, match="validate_all found no checkpoints"):
        run_trainer("validate_all", config)


def test_validation_reports_every_problem_with_its_location():
    config = params("unused")
    init = config["trainer"]["init"]
    init["loop"]["num_step"] = 3
    init["optimizer"]["Adam"] = {}
    init["callbacks"] = [{"NoSuchCallback": {}}]
    init["loggers"] = ["CheckLoss"]
    config["trainer"]["fit"]["train_dataloader"].pop("data_processor")
    with pytest.raises(TrainerConfigError) as info:
        validate_trainer_params(config)
    message = str(info.value)
    for expected in [
        "trainer.init.loop.num_step: unknown key",
        "trainer.init.optimizer",
        "exactly one key",
        "unknown callback or logger 'NoSuchCallback'",
        "CheckLoss is not a Logger",
        "trainer.fit.train_dataloader.data_processor: Field required",
    ]:
        assert expected in message


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"trainer": {"init": {"device": "CPU", "model": {"name": "x"}}}, "oops": 1},
            "Unknown top-level keys",
        ),
        ({"trainer": {"init": {"device": "TPU", "model": {"name": "x"}}}}, "trainer.init.device"),
        ({"trainer": {"init": {"device": "CPU"}}}, "trainer.init.model: Field required"),
        (
            {
                "trainer": {
                    "init": {
                        "device": "CPU",
                        "model": {"name": "x"},
                        "callbacks": [{"Checkpoint": {}}],
                    }
                }
            },
            "is a core callback",
        ),
        ({"trainer": []}, "non-empty list"),
    ],
)
def test_invalid_configs(config, message):
    with pytest.raises(TrainerConfigError, match=message):
        validate_trainer_params(config)


def test_unknown_model_and_optimizer_names_fail_before_training(tmp_path):
    config = params(tmp_path)
    config["trainer"]["init"]["model"] = {"name": "NotRegistered"}
    with pytest.raises(TrainerConfigError, match="init.model.name: Unknown model 'NotRegistered'"):
        run_trainer("fit", config)
    config = params(tmp_path)
    config["trainer"]["init"]["optimizer"] = {"Sgdd": {"lr": 0.1}}
    with pytest.raises(TrainerConfigError, match="Sgdd: Invalid optimizer type"):
        run_trainer("fit", config)
    config = params(tmp_path)
    config["trainer"]["fit"]["train_dataloader"]["data_processor"] = "no_such.module:f"
    with pytest.raises(TrainerConfigError, match="data_processor: Cannot import module"):
        run_trainer("fit", config)


def test_legacy_params_convert_to_the_trainer_config():
    legacy = {
        "runconfig": {
            "model_dir": "md",
            "seed": 3,
            "target_device": "CSX",
            "num_steps": 10,
            "eval_frequency": 5,
            "checkpoint_steps": 5,
            "log_steps": 2,
            "keep_checkpoint_max": 2,
            "checkpoint_path": "md/checkpoint_5.mdl",
            "mode": "train",
        },
        "model": {
            "name": "pkg:Model",
            "hidden": 32,
            "mixed_precision": True,
            "fp16_type": "cbfloat16",
        },
        "optimizer": {
            "optimizer_type": "AdamW",
            "weight_decay": 0.01,
            "max_gradient_norm": 1.0,
            "learning_rate": [
                {
                    "scheduler": "Linear",
                    "initial_learning_rate": 0.0,
                    "end_learning_rate": 1e-3,
                    "total_iters": 4,
                }
            ],
            "grad_accum_steps": 1,
        },
        "train_input": {"data_processor": "pkg:train_data", "batch_size": 8},
        "eval_input": {"data_processor": "pkg:eval_data", "batch_size": 8},
    }
    trainer = convert_legacy_params_to_trainer_params(legacy)["trainer"]
    assert trainer["init"] == {
        "model_dir": "md",
        "seed": 3,
        "backend": {"backend_type": "CSX"},
        "model": {"name": "pkg:Model", "hidden": 32},
        "precision": {"enabled": True, "fp16_type": "cbfloat16", "max_gradient_norm": 1.0},
        "optimizer": {"AdamW": {"weight_decay": 0.01}},
        "schedulers": [
            {
                "LinearLR": {
                    "initial_learning_rate": 0.0,
                    "end_learning_rate": 1e-3,
                    "total_iters": 4,
                }
            }
        ],
        "loop": {"num_steps": 10, "eval_frequency": 5, "grad_accum_steps": 1},
        "checkpoint": {"steps": 5},
        "logging": {"log_steps": 2},
        "callbacks": [{"KeepNCheckpoints": {"n": 2}}],
    }
    assert trainer["fit"] == {
        "train_dataloader": {"data_processor": "pkg:train_data", "batch_size": 8},
        "val_dataloader": {"data_processor": "pkg:eval_data", "batch_size": 8},
        "ckpt_path": "md/checkpoint_5.mdl",
    }
    assert trainer["validate_all"]["ckpt_paths"] == ["md/checkpoint_5.mdl"]
    # Validation resolves the names (and checks their arguments): give it real ones.
    register_data_processor("LegacyData")(lambda batch_size: torch_loader(batch_size))
    trainer["init"]["model"]["name"] = "tests.trainer.common:ClassifierMLP"
    for loader in (
        trainer["fit"]["train_dataloader"],
        trainer["fit"]["val_dataloader"],
        trainer["validate"]["val_dataloader"],
        trainer["validate_all"]["val_dataloaders"],
    ):
        loader["data_processor"] = "LegacyData"
    validate_trainer_params({"trainer": trainer})
    assert convert_legacy_params_to_trainer_params(
        {
            "runconfig": {"model_name": "m"},
            "optimizer": {"optimizer_type": "SGD", "learning_rate": 0.5},
        }
    )["trainer"]["init"]["schedulers"] == [{"ConstantLR": {"learning_rate": 0.5}}]
    with pytest.raises(ValueError, match="do not name the model"):
        convert_legacy_params_to_trainer_params({"runconfig": {}})
    with pytest.raises(ValueError, match="no Trainer equivalent"):
        convert_legacy_params_to_trainer_params({"runconfig": {"model_name": "m", "frobnicate": 1}})


@pytest.mark.slow
def test_a_list_of_phases_runs_in_order_on_one_backend(tmp_path):
    first, second = params(tmp_path / "phase1")["trainer"], params(tmp_path / "phase2")["trainer"]
    for phase, steps in ((first, 4), (second, 2)):
        phase["init"]["loop"] = {"num_steps": steps, "eval_frequency": None}
        phase["init"]["checkpoint"] = {"steps": steps}
        phase["fit"].pop("val_dataloader")
    second["fit"]["ckpt_path"] = str(tmp_path / "phase1" / "checkpoint_4.mdl")
    trainers = run_trainer("train", {"trainer": [first, second]})
    assert [t.global_step for t in trainers] == [4, 6]  # phase 2 continued from phase 1
    assert trainers[0].backend is trainers[1].backend
    assert (tmp_path / "phase2" / "checkpoint_6.mdl").exists()


@pytest.mark.slow
def test_cli_overrides_and_errors_in_process(tmp_path):
    from cerebras.modelzoo.trainer.cli import main

    config = params(tmp_path / "ignored")
    config["trainer"]["init"]["loop"] = {"num_steps": 2, "eval_frequency": None}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path), "--model_dir", str(tmp_path / "chosen")]) == 0
    assert (tmp_path / "chosen" / "checkpoint_2.mdl").exists()
    assert not (tmp_path / "ignored").exists()


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "does not exist"),
        ("- 1\n- 2\n", "must hold a mapping"),
        ("trainer: {init: [unclosed\n", "is not valid YAML"),
    ],
)
def test_cli_reports_a_bad_params_file_in_a_line(tmp_path, capsys, content, expected):
    from cerebras.modelzoo.trainer.cli import main

    path = tmp_path / "params.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["fit", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


@pytest.mark.parametrize(
    "section, key, value, expected",
    [
        (
            "optimizer",
            "lr",
            "fast",
            "trainer.init.optimizer: SGD.lr must be a number, got the string 'fast'",
        ),
        (
            "optimizer",
            "momentum",
            "1e-3",
            "SGD.momentum must be a number, got the string '1e-3' "
            "(YAML reads a number without a dot",
        ),
        ("optimizer", "learning_rate", "fast", "SGD.learning_rate must be a number"),
        (
            "schedulers",
            "end_learning_rate",
            "low",
            "trainer.init.schedulers: LinearLR.end_learning_rate must be a number",
        ),
    ],
)
def test_a_wrong_value_in_the_yaml_is_named_by_its_key(
    tmp_path, capsys, section, key, value, expected
):
    from cerebras.modelzoo.trainer.cli import main

    config = params(tmp_path)
    init = config["trainer"]["init"]
    target = (
        init["optimizer"]["SGD"] if section == "optimizer" else init["schedulers"][0]["LinearLR"]
    )
    target[key] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["fit", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3
    assert not (tmp_path / "checkpoint_12.mdl").exists()  # nothing ran


def test_a_missing_mode_section_says_what_to_add(tmp_path, capsys):
    from cerebras.modelzoo.trainer.cli import main

    config = params(tmp_path)
    del config["trainer"]["validate"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Mode 'validate' needs a `validate` section" in err and "val_dataloader:" in err


@pytest.mark.slow
def test_the_console_script_resolves_import_paths_from_the_working_directory(tmp_path):
    """``cszoo fit params.yaml`` finds ``module:Name`` in the working directory, as
    ``python -m cerebras.modelzoo.trainer fit`` does (a console script's sys.path starts at
    its own bin directory)."""
    script = os.path.join(os.path.dirname(sys.executable), "cszoo")
    if not os.path.exists(script):
        pytest.skip("the cszoo console script is not installed in this environment")
    (tmp_path / "local_models").mkdir()
    (tmp_path / "local_models" / "__init__.py").write_text(
        "from tests.trainer.common import ClassifierMLP, torch_loader\n"
    )
    config = params(tmp_path / "model_dir")
    config["trainer"]["init"]["model"]["name"] = "local_models:ClassifierMLP"
    config["trainer"]["init"]["loop"] = {"num_steps": 2, "eval_frequency": None}
    config["trainer"]["init"]["checkpoint"] = {"steps": 2}
    config["trainer"]["init"]["schedulers"] = None
    config["trainer"]["fit"] = {
        "train_dataloader": {"data_processor": "local_models:torch_loader", "num_batches": 2}
    }
    del config["trainer"]["validate"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(config))
    repo = REPO
    env = dict(os.environ, PYTHONPATH=repo)  # the tests package, not the working directory
    result = subprocess.run(
        [script, "fit", "params.yaml"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "model_dir" / "checkpoint_2.mdl").exists()


# ------------------------------------------------------------- configs are data, not code
def _cli(tmp_path, capsys, config):
    """``cszoo fit`` on ``config`` in this process: (exit status, stderr)."""
    from cerebras.modelzoo.trainer.cli import main

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(config))
    status = main(["fit", str(path)])
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    "where, path, expected",
    [
        (
            "model",
            "os:system",
            "trainer.init.model.name: 'os:system' is not a torch.nn.Module subclass",
        ),
        (
            "model",
            "shutil:rmtree",
            "trainer.init.model.name: 'shutil:rmtree' is not a torch.nn.Module subclass",
        ),
        (
            "data",
            "os:system",
            "trainer.fit.train_dataloader.data_processor: 'os:system' is not a data processor",
        ),
        (
            "data",
            "subprocess:run",
            "trainer.fit.train_dataloader.data_processor: 'subprocess:run' is not a data processor",
        ),
        ("callback", "os:system", "'os:system' is not a Callback class"),
    ],
)
def test_a_yaml_import_path_runs_nothing_but_what_its_key_names(
    tmp_path, capsys, where, path, expected
):
    """A shared config must not run arbitrary functions: an import path is checked to be a
    class of the kind its key names before anything is called (issue 31, item 3)."""
    config = params(tmp_path / "model_dir")
    init, fit = config["trainer"]["init"], config["trainer"]["fit"]
    marker = tmp_path / "MARKER"
    if where == "model":
        init["model"] = {
            "name": path,
            ("command" if path == "os:system" else "path"): f"touch {marker}"
            if path == "os:system"
            else str(tmp_path),
        }
    elif where == "data":
        fit["train_dataloader"] = {
            "data_processor": path,
            ("command" if path == "os:system" else "args"): f"touch {marker}",
        }
    else:
        init["callbacks"] = [{path: {"command": f"touch {marker}"}}]
    status, err = _cli(tmp_path, capsys, config)
    assert status == 2 and expected in err, err
    assert "Traceback" not in err
    assert not marker.exists() and tmp_path.exists()
    assert not (tmp_path / "model_dir").exists()  # refused before anything was built


@pytest.mark.parametrize(
    "path, refused",
    [
        (
            "venv.__main__:X",
            "'venv.__main__' is a command line (a __main__ module), which importing would run",
        ),
        ("this:X", "'this' is part of the Python installation"),
        ("antigravity:X", "'antigravity' is part of the Python installation"),
        ("idlelib.idle_test:X", "'idlelib' is part of the Python installation"),
    ],
)
@pytest.mark.parametrize("where", ["callbacks", "loggers", "model", "data"])
def test_a_yaml_import_path_never_imports_what_a_config_may_not_name(
    tmp_path, capsys, monkeypatch, where, path, refused
):
    """Importing a module runs it: an import path is located first and only a module a config
    may name is imported (issue 49, item 1). ``venv.__main__`` made a virtualenv in the
    working directory, ``this`` printed the Zen of Python, before anything was checked; now
    nothing runs and the one line names the key, the path and the rule."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["cszoo", "--help"])  # (what venv's main would read)
    monkeypatch.setenv("BROWSER", "true")  # (what antigravity would open)
    config = params(tmp_path / "model_dir")
    init, fit = config["trainer"]["init"], config["trainer"]["fit"]
    key = {
        "callbacks": "trainer.init.callbacks",
        "loggers": "trainer.init.loggers",
        "model": "trainer.init.model.name",
        "data": "trainer.fit.train_dataloader.data_processor",
    }[where]
    if where in ("callbacks", "loggers"):
        init[where] = [path]
    elif where == "model":
        init["model"] = {"name": path}
    else:
        fit["train_dataloader"] = {"data_processor": path}
    module = path.partition(":")[0]
    already = {name for name in sys.modules if name.split(".")[0] == module.split(".")[0]}
    status, err = _cli(tmp_path, capsys, config)
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"Invalid trainer config: {key}: '{path}': {refused}" in lines[0], err
    assert "never a __main__ module" in lines[0] and "--import" in lines[0]
    assert capsys.readouterr().out == ""  # nothing printed by the named module
    assert sorted(os.listdir(tmp_path)) == ["params.yaml"]  # nothing made
    assert {
        name for name in sys.modules if name.split(".")[0] == module.split(".")[0]
    } == already  # not even the packages above it were imported


def test_a_package_is_not_imported_to_find_a_main_module_inside_it(tmp_path, capsys, monkeypatch):
    """The run's own package is allowed, but its ``__main__`` is not, and refusing it runs
    not even the package's ``__init__`` (``importlib.util.find_spec`` would import it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    package = tmp_path / "shared_models"
    package.mkdir()
    (package / "__init__.py").write_text("open('INIT_RAN', 'w').close()\n")
    (package / "__main__.py").write_text("open('MAIN_RAN', 'w').close()\n")
    config = params(tmp_path / "model_dir")
    config["trainer"]["init"]["callbacks"] = ["shared_models.__main__:X"]
    status, err = _cli(tmp_path, capsys, config)
    assert status == 2 and "'shared_models.__main__' is a command line" in err, err
    assert not (tmp_path / "INIT_RAN").exists() and not (tmp_path / "MAIN_RAN").exists()
    assert "shared_models" not in sys.modules


def test_a_module_given_with_import_may_be_named(tmp_path, capsys):
    """``cszoo --import MODULE`` (``registry.allow_imports``) is how a run lets its config
    name an installed module that is not imported yet."""
    from cerebras.modelzoo.trainer.registry import allow_imports, import_object

    assert "this" not in sys.modules
    try:
        with pytest.raises(ValueError, match="'this' is part of the Python installation"):
            import_object("this:s")
        assert "this" not in sys.modules and capsys.readouterr().out == ""
        allow_imports("this")
        assert isinstance(import_object("this:s"), str)  # imported: it printed its poem
        assert "The Zen of Python" in capsys.readouterr().out
    finally:
        sys.modules.pop("this", None)


LONG = "q" * 100_000


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t["init"].update(callbacks=[LONG]),
        lambda t: t["init"].update(callbacks=[{"KeepNCheckpoints": {LONG: 1}}]),
        lambda t: t["init"]["loop"].update({LONG: 1}),
        lambda t: t["init"].update(optimizer={LONG: {"lr": 0.1}}),
        lambda t: t["init"]["optimizer"]["SGD"].update(lr=LONG),
        lambda t: t["init"].update(model={"name": LONG}),
        lambda t: t["init"].update(model={"name": f"x.{LONG}:Net"}),
        lambda t: t["init"].update(schedulers=[{LONG: {}}]),
    ],
    ids=["callback", "argument", "key", "optimizer", "value", "model", "module", "scheduler"],
)
def test_a_long_string_in_the_yaml_makes_a_short_error(tmp_path, capsys, edit):
    """The YAML is a foreign file: what the error quotes of it is a short prefix (issue 49)."""
    config = params(tmp_path / "model_dir")
    edit(config["trainer"])
    status, err = _cli(tmp_path, capsys, config)
    assert status == 2, err[:500]
    assert len(err) < 2000, err[:500]
    assert "qqqq" in err and "characters" in err, err[:500]


def test_a_yaml_tag_is_refused_with_the_reason(tmp_path, capsys):
    from cerebras.modelzoo.trainer.cli import main

    path = tmp_path / "params.yaml"
    path.write_text(f"trainer: !!python/object/apply:os.system ['touch {tmp_path}/MARKER']\n")
    assert main(["fit", str(path)]) == 2
    err = capsys.readouterr().err
    assert "YAML tags are not allowed (`!!python/object/apply:os.system`)" in err, err
    assert "plain YAML" in err and "Traceback" not in err
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.slow
def test_data_processors_and_models_of_the_right_kind_still_run(tmp_path):
    """The checks accept what configs legitimately name: a Module subclass, a function
    annotated to return a DataLoader, and registered factories of any kind."""
    register_model("TinyFactory")(lambda hidden=16: ClassifierMLP(hidden))
    register_data_processor("TinyLoaderFactory")(lambda num_batches: torch_loader(num_batches))
    config = params(tmp_path / "run")
    init, fit = config["trainer"]["init"], config["trainer"]["fit"]
    init["loop"] = {"num_steps": 2, "eval_frequency": None}
    init["checkpoint"] = {"steps": 2}
    init["schedulers"] = None
    fit.pop("val_dataloader")
    (trainer,) = run_trainer("fit", config)  # import paths
    assert trainer.global_step == 2
    init["model"] = {"name": "TinyFactory", "hidden": 16}
    fit["train_dataloader"] = {"data_processor": "TinyLoaderFactory", "num_batches": 2}
    config["trainer"]["init"]["model_dir"] = str(tmp_path / "run2")
    (trainer,) = run_trainer("fit", config)  # registered names
    assert trainer.global_step == 2


# ------------------------------------------------------------------ arguments by signature
@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            lambda c: c["init"]["optimizer"]["SGD"].update(lrr=0.002),
            "trainer.init.optimizer: SGD: unknown argument 'lrr'; accepted: ",
        ),
        (
            lambda c: c["init"]["schedulers"][0]["LinearLR"].update(total_iter=3),
            "trainer.init.schedulers: LinearLR: unknown argument 'total_iter'; accepted: ",
        ),
        (
            lambda c: c["init"]["model"].update(chanels=3),
            "trainer.init.model: ClassifierMLP: unknown argument 'chanels'; accepted: hidden",
        ),
        (
            lambda c: c["fit"]["train_dataloader"].update(batchsize=3),
            "trainer.fit.train_dataloader: torch_loader: unknown argument 'batchsize'; accepted: "
            "num_batches, seed, start",
        ),
        (
            lambda c: c["fit"]["train_dataloader"].pop("num_batches"),
            "trainer.fit.train_dataloader: torch_loader: missing argument 'num_batches'",
        ),
        (
            lambda c: c["init"].update(callbacks=[{"KeepNCheckpoints": {"m": 1}}]),
            "trainer.init.callbacks: KeepNCheckpoints: unknown argument 'm'; accepted: n",
        ),
        (
            lambda c: c["init"].update(seed=2**70),
            "trainer.init.seed: must be an integer from -2**63 to 2**64 - 1",
        ),
        (
            lambda c: c["init"].update(sparsity={"algorithm": "statc", "sparsity": 0.3}),
            "trainer.init.sparsity: Unsupported sparsity algorithm: statc. Supported types: ",
        ),
        (
            lambda c: c["init"].update(
                sparsity={"algorithm": "set", "sparsity": 0.3, "drop_fracton": 0.1}
            ),
            "trainer.init.sparsity: Invalid sparsity config for SET: unknown argument 'drop_fracton'; "
            "accepted: drop_fraction, init_method, sparsity, update",
        ),
        (
            lambda c: c["init"].update(
                sparsity=[{"param_filter": "fc*", "sparsity": 0.3}, {"sparsity": 1.5}]
            ),
            "trainer.init.sparsity: Invalid sparsity config for Static: Invalid sparsity level 1.5",
        ),
        (
            lambda c: c["init"].pop("optimizer"),
            "trainer.init.optimizer: mode 'fit' trains, and trainer phase 0 names no optimizer",
        ),
        (
            lambda c: c["init"]["checkpoint"].update(checkpoint_name="ckpt_{step:6d}.mdl"),
            "trainer.init.checkpoint.checkpoint_name: checkpoint_name must be a file name with the "
            "field {step} exactly once, written as digits",
        ),
    ],
)
def test_every_yaml_argument_is_checked_against_its_signature_before_building(
    tmp_path, capsys, edit, expected
):
    """A typo in any argument is one line naming the key and the accepted names, exit 2,
    before anything is built (an optimizer typo used to train with the default lr, a model or
    data-processor typo came as a TypeError after building started) (issue 31, items 4, 9)."""
    config = params(tmp_path / "model_dir")
    edit(config["trainer"])
    status, err = _cli(tmp_path, capsys, config)
    assert status == 2, err
    assert expected in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3, err
    assert not (tmp_path / "model_dir").exists()  # nothing was built
