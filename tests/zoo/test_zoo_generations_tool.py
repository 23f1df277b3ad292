"""tools/zoo_generations.py without the zoo: checkout of a tag, config builders, log parsing
and the verdicts (the zoo runs themselves need MODELZOO_SRC: ``make zoo-generations``)."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import paths

ROOT = Path(paths.REPO)


def _tool():
    spec = importlib.util.spec_from_file_location(
        "zoo_generations", ROOT / "tools" / "zoo_generations.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["zoo_generations"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_checkout_of_a_tag_from_a_bare_repository(tmp_path):
    tool = _tool()
    work = tmp_path / "work"
    (work / "a").mkdir(parents=True)
    (work / "a" / "run.py").write_text("print('v1')\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(work)]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    subprocess.run(git + ["tag", "Release_9.9.0"], check=True)
    (work / "a" / "run.py").write_text("print('v2')\n")
    subprocess.run(git + ["commit", "-qam", "two"], check=True)
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)

    for source in (work, bare):
        dest = tmp_path / f"out_{source.name}"
        assert tool.checkout(tool.git_dir(source), "Release_9.9.0", dest) == []
        assert (dest / "a" / "run.py").read_text() == "print('v1')\n"
    with pytest.raises(SystemExit, match="not a git repository"):
        tool.git_dir(tmp_path / "out_work")


def test_configs_are_tiny_and_cpu_runs_float32():
    tool = _tool()
    shipped = {
        "train_input": {"data_dir": "./mnist", "batch_size": 128},
        "eval_input": {"data_dir": "./mnist", "batch_size": 128},
        "model": {"mixed_precision": True, "fp16_type": "cbfloat16"},
        "runconfig": {"max_steps": 100000, "checkpoint_steps": 5000},
    }
    params = tool.fc_mnist_params(shipped, tool.Settings())
    assert params["train_input"]["use_fake_data"] and params["eval_input"]["batch_size"] == 4
    assert params["runconfig"]["max_steps"] == 20 and params["runconfig"]["checkpoint_steps"] == 10
    assert shipped["runconfig"]["max_steps"] == 100000  # the shipped config is not changed
    cpu = tool.float32(params)
    assert cpu["model"]["mixed_precision"] is False and "fp16_type" not in cpu["model"]
    assert params["model"]["fp16_type"] == "cbfloat16"  # CSX keeps the shipped precision


def test_first_error_and_log_losses(tmp_path):
    tool = _tool()
    log = (
        "| Train Device=CPU, Step=1, Loss=2.50000, Rate=1\n"
        "| Train Device=CPU, Step=2, Loss=2.25000, Rate=1\n"
        "Avg Eval Loss: 2.125\n"
        "Traceback (most recent call last):\n"
        '  File "/x/zoo/run_cstorch_flow.py", line 69, in <module>\n'
        "    from cerebras.pytorch.core import modes\n"
        "ImportError: cannot import name 'modes'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/x/zoo/run.py", line 3, in <module>\n'
        "RuntimeError: later\n"
    )
    assert (
        tool.first_error(log) == "run_cstorch_flow.py:69: ImportError: cannot import name 'modes'"
    )
    assert tool.first_error("all good") is None
    losses, eval_loss = tool.losses_2x(tmp_path, log)
    assert losses == {1: 2.5, 2: 2.25} and eval_loss == 2.125


def test_verdicts():
    tool = _tool()
    s = tool.Settings(steps=4, checkpoint_steps=2)
    curve = {1: 2.0, 2: 1.9, 3: 1.8, 4: 1.7}

    def run(losses, eval_loss=None, rc=0):
        return dict(rc=rc, losses=losses, eval_loss=eval_loss, error=None, project_cstorch=True)

    runs = {
        "cpu": run(curve, 1.6),
        "eager": run({**curve, 4: 1.7 * (1 + 2e-6)}),
        "csx": run({k: v * 1.001 for k, v in curve.items()}),
        "eval": run({}, 1.6),
        "resume": run({3: 1.8, 4: 1.7}),
    }
    verdict = tool.judge(runs, s)
    assert [verdict[k].split()[0] for k in ("cpu", "csx", "eval", "resume", "vs_eager")] == [
        "ok"
    ] * 5
    runs["eager"] = run({**curve, 1: 2.0 + 1e-6})
    assert "step 1 differs" in tool.judge(runs, s)["vs_eager"]
    runs["resume"] = run({3: 1.5, 4: 1.4})  # neither continues nor repeats the curve
    assert tool.judge(runs, s)["resume"].startswith("FAIL")
    # the first batches again (the zoo says so, or the losses show it): compared with the
    # continuous run's steps on the same batches
    runs["resume"] = run({3: 2.0 * 0.999, 4: 1.9 * 0.999})
    assert tool.judge(runs, s)["resume"] == "ok 1.0e-03 (data restarts)"
    runs["resume"]["data_restarted"] = True
    assert tool.judge(runs, s)["resume"] == "ok 1.0e-03 (data restarts)"
    runs["resume"] = run({1: 2.0, 2: 1.9, 3: 1.8, 4: 1.7})  # started over: not a resume
    assert tool.judge(runs, s)["resume"].startswith("FAIL")


def test_stand_ins_the_zoo_loaded_from_the_tests_folder():
    """The probe's list of modules loaded from tests/ (the stubs) becomes the row's
    ``stand_ins``: "none", the packages, or "?" for runs recorded before the probe said."""
    tool = _tool()
    s = tool.Settings(steps=2, checkpoint_steps=1)

    def run(from_tests, torch_xla=None):
        return dict(
            rc=0,
            losses={},
            eval_loss=None,
            error=None,
            project_cstorch=True,
            from_tests=from_tests,
            torch_xla=torch_xla,
        )

    verdict = tool.judge({"cpu": run([]), "csx": run([], "cerebras_pytorch.lazy.xla_pieces")}, s)
    assert verdict["stand_ins"] == "none"
    assert verdict["torch_xla"] == "cerebras_pytorch.lazy.xla_pieces"
    verdict = tool.judge(
        {"cpu": run(["torchvision", "torchvision.datasets"]), "csx": run(["lm_eval"])}, s
    )
    assert verdict["stand_ins"] == "lm_eval, torchvision" and "torch_xla" not in verdict
    assert tool.judge({"cpu": run(None)}, s)["stand_ins"] == "?"


def test_csx_eval_verdict():
    """``--csx-eval``: the CSX checkpoint's eval on CSX against its CPU eval (or the eager
    forward's value), at CSX tolerance; absent unless asked for."""
    tool = _tool()
    s = tool.Settings(steps=2, checkpoint_steps=1)

    def run(eval_loss, rc=0):
        return dict(rc=rc, losses={}, eval_loss=eval_loss, error=None, project_cstorch=True)

    runs = {"cpu": run(None), "eval_csx": run(0.3223), "eval_csx_reference": run(0.3218)}
    assert tool.judge(runs, s)["csx_eval"] == "ok 1.6e-03"
    runs["eval_csx_reference"] = dict(value=0.25, rc=0, losses={}, project_cstorch=True, error=None)
    assert tool.judge(runs, s)["csx_eval"].startswith("FAIL")
    runs["eval_csx"] = run(None, rc=1)
    assert tool.judge(runs, s)["csx_eval"] == "FAIL"
    assert "csx_eval" not in tool.judge({"cpu": run(None)}, s)


def test_1x_command_lines():
    tool = _tool()
    lines = {line.line: line for line in tool.RELEASE_LINES}
    args = ("run.py", "CSX", "train", "p.yaml", "md", None)
    # 1.9: the 2.x command; 1.8: CSX names the strategy and runs with -O; 1.6/1.7: --appliance
    assert lines["1.9"].cli(*args) == [
        "run.py",
        "CSX",
        "--mode",
        "train",
        "--params",
        "p.yaml",
        "--model_dir",
        "md",
    ]
    assert lines["1.8"].cli(*args) == [
        "-O",
        "run.py",
        "CSX",
        "weight_streaming",
        "--mode",
        "train",
        "--params",
        "p.yaml",
        "--model_dir",
        "md",
    ]
    assert lines["1.8"].cli("run.py", "CPU", "eval", "p.yaml", "md", "c.mdl") == [
        "run.py",
        "CPU",
        "--mode",
        "eval",
        "--params",
        "p.yaml",
        "--model_dir",
        "md",
        "--checkpoint_path",
        "c.mdl",
    ]
    # 1.8's cstorch flow evaluates up to max_steps from the checkpoint's step: beyond step 20
    csx_eval = lines["1.8"].cli("run.py", "CSX", "eval", "p.yaml", "md", "c.mdl")
    assert csx_eval[0] == "run.py" and csx_eval[-2:] == ["--max_steps", "25"]
    # -O only for the cstorch flow's training assert (GENERATIONS_1x.md): the runner and
    # the eval run as they are
    assert lines["1.8-runner"].cli(*args) == lines["1.8"].cli(*args)[1:]
    for name in ("1.7", "1.6", "1.6.0"):
        assert lines[name].cli(*args) == [
            "run.py",
            "--appliance",
            "--params",
            "p.yaml",
            "--mode",
            "train",
            "--model_dir",
            "md",
        ]
        assert lines[name].cli("run.py", "CPU", "eval", "p.yaml", "md", "c.mdl") == [
            "run.py",
            "--params",
            "p.yaml",
            "--mode",
            "eval",
            "--model_dir",
            "md",
            "--checkpoint_path",
            "c.mdl",
        ]
    # the 1.8/1.9 flows are picked by the runconfig; 1.6/1.7 have only the runner
    rc = {"runconfig": {}}
    assert lines["1.9"].runconfig(rc)["runconfig"]["experimental_api"] is True
    assert lines["1.8-runner"].runconfig(rc)["runconfig"] == {
        "experimental_api": False,
        "transfer_processes": None,
    }
    assert lines["1.7"].runconfig is None and rc == {"runconfig": {}}


def test_1x_log_losses(tmp_path):
    """The 1.x runners' log lines (lower-case device, ``Time=``; ``INFO:`` without a date on
    the appliance) and their eval summary."""
    tool = _tool()
    log = (
        "2026-11-27 08:51:02,451 INFO:   | Train Device=cpu, Step=1, Loss=2.53246, "
        "Time=08:51:02\n"
        "INFO:   | Train Device=CSX, Step=2, Loss=2.51953, Time=08:52:23\n"
        "2026-11-27 08:47:21,327 INFO:   | Eval Device=cpu, Step=1, Loss=1.05230, "
        "Time=08:47:21\n"
        "2026-11-27 08:47:21,379 INFO:   Avg Eval Loss: 1.0522966384887695\n"
    )
    lines = {line.line: line for line in tool.RELEASE_LINES}
    for name in ("1.9", "1.9-runner", "1.8", "1.8-runner", "1.7", "1.6"):
        losses, eval_loss = lines[name].losses(tmp_path, log)
        assert losses == {1: 2.53246, 2: 2.51953} and eval_loss == 1.0522966384887695
    # 1.8's runner writes its eval summary its own way
    summary = "2026-11-27 11:30:22,896 INFO:   Avg Eval. Loss = 1.0522966384887695\n"
    assert lines["1.8"].losses(tmp_path, summary) == ({}, 1.0522966384887695)
    assert tool.losses_2x(tmp_path, summary) == ({}, None)


def test_1x_configs(tmp_path):
    tool = _tool()
    shipped = {
        "train_input": {
            "data_dir": "x",
            "batch_size": 112,
            "shuffle": True,
            "num_workers": 8,
            "prefetch_factor": 10,
        },
        "eval_input": {"data_dir": "y", "batch_size": 112, "num_workers": 8},
        "model": {"hidden_size": 768, "num_hidden_layers": 12, "mixed_precision": True},
        "optimizer": {"learning_rate": [{"scheduler": "Linear", "alpha": 0.1}]},
        "runconfig": {"max_steps": 151600},
    }
    dummy = tool.gpt2_params_1x(shipped, tool.Settings())
    # torch 2 refuses the 1.x processors' prefetch_factor without workers: one worker
    assert dummy["train_input"]["num_workers"] == 1 == dummy["eval_input"]["num_workers"]
    assert dummy["train_input"]["data_processor"] == "DummyDataProcessor"
    cpu = tool.float32_1x(dummy)
    assert cpu["model"]["use_bfloat16"] is False and cpu["model"]["mixed_precision"] is False
    assert "use_bfloat16" not in dummy["model"]

    hdf5 = tool.gpt2_params_hdf5(shipped, tool.Settings())
    hdf5 = tool.gpt2_hdf5_data(tmp_path, hdf5)
    import h5py

    for section, batches in (("train_input", 20), ("eval_input", 5)):
        inp = hdf5[section]
        assert inp["data_processor"] == "GptHDF5DataProcessor"
        files = sorted(Path(inp["data_dir"]).glob("*.h5"))
        assert len(files) == 1
        with h5py.File(files[0]) as f:
            data = f["data"][:]
            # every step's batch is there; ids inside the model's vocabulary, labels = next ids
            assert f.attrs["n_examples"] == len(data) >= inp["batch_size"] * batches
            assert data.shape[1:] == (3, inp["max_sequence_length"])
            assert 0 <= data[:, 0].min() and data[:, 0].max() < hdf5["model"]["vocab_size"]
            assert (data[:, 0, 1:] == data[:, 2, :-1]).all()
    # 1.6 reads one dataset per example: the same examples
    lines = {line.line: line for line in tool.RELEASE_LINES}
    gpt2_16 = next(m for m in lines["1.6"].models if m.name == "gpt2")
    old = gpt2_16.data(tmp_path / "16", tool.gpt2_params_hdf5(shipped, tool.Settings()))
    with h5py.File(next(Path(old["train_input"]["data_dir"]).glob("*.h5"))) as f:
        assert f.attrs["n_examples"] == len(
            data_train := [f[f"example_{i}"][:] for i in range(f.attrs["n_examples"])]
        )
        assert data_train[0].shape == (3, 64)
    with h5py.File(next(Path(hdf5["train_input"]["data_dir"]).glob("*.h5"))) as f:
        assert (f["data"][:] == np.stack(data_train)).all()


def test_fc_mnist_reference_eval_is_the_models_loss(tmp_path):
    """The eager forward written in the harness equals torch's own modules on the fake
    batch (zeros, label 0), from a checkpoint in cstorch's format."""
    sys.path[0:0] = [str(ROOT), str(ROOT / "compat")]
    import torch

    import cstorch

    tool = _tool()
    torch.manual_seed(0)
    hidden = [torch.nn.Linear(784, 16), torch.nn.Linear(16, 16)]
    last = torch.nn.Linear(16, 10)
    for layer in [*hidden, last]:
        torch.nn.init.normal_(layer.bias)  # zeros in, so the biases carry the loss
    state = {
        f"model.fc_layers.{i}.{k}": v
        for i, layer in enumerate(hidden)
        for k, v in layer.state_dict().items()
    }
    state.update({f"model.last_layer.{k}": v for k, v in last.state_dict().items()})
    cstorch.save({"model": state}, str(tmp_path / "checkpoint_20.mdl"))
    with torch.no_grad():
        x = torch.zeros(8, 784)
        for layer in hidden:
            x = torch.relu(layer(x))
        expected = torch.nn.functional.cross_entropy(last(x), torch.zeros(8, dtype=torch.long))
    got = tool.fc_mnist_reference_eval(
        str(tmp_path / "checkpoint_20.mdl"), {"eval_input": {"batch_size": 8}}
    )
    assert got == pytest.approx(float(expected), rel=1e-6)


def test_verdicts_when_only_csx_runs():
    """Where the CPU run cannot run (1.6's fc_mnist needs torchvision and MNIST), eval and
    resume read the CSX run's checkpoints: eval is judged at CSX tolerance against the
    reference forward, resume against the CSX curve."""
    tool = _tool()
    s = tool.Settings(steps=4, checkpoint_steps=2)
    curve = {1: 2.0, 2: 1.9, 3: 1.8, 4: 1.7}

    def run(losses, eval_loss=None, rc=0, **extra):
        return dict(
            rc=rc, losses=losses, eval_loss=eval_loss, error=None, project_cstorch=True, **extra
        )

    runs = {
        "cpu": run({}, rc=1),
        "eager": run({}, rc=1),
        "csx": run(curve),
        "eval": run({}, 1.6 * (1 + 5e-4), reference=1.6, **{"from": "csx"}),
        "resume": run({3: 1.8, 4: 1.7}, **{"from": "csx"}),
    }
    verdict = tool.judge(runs, s)
    assert verdict["cpu"] == "FAIL" and verdict["csx"] == "ok"
    assert verdict["eval"] == "ok 5.0e-04 (CSX)"
    assert verdict["resume"] == "ok 0.0e+00 (CSX)"
    runs["eval"]["eval_loss"] = 1.6 * 1.05
    assert tool.judge(runs, s)["eval"].startswith("FAIL")


def test_24_trainer_config(tmp_path):
    """2.4's gpt2 from gpt3's Trainer YAML (the shape of 2.4's Cerebras_GPT/111m.yaml):
    tiny, the schedule over the run, HDF5 data written for every loader, CPU float32."""
    tool = _tool()
    loader = {
        "data_processor": "GptHDF5DataProcessor",
        "data_dir": "./pile",
        "batch_size": 120,
        "shuffle": True,
        "num_workers": 1,
        "prefetch_factor": 10,
    }
    shipped = {
        "trainer": {
            "init": {
                "backend": {"backend_type": "CSX"},
                "model": {
                    "name": "gpt3",
                    "hidden_size": 768,
                    "num_hidden_layers": 10,
                    "vocab_size": 50257,
                    "dropout_rate": 0.1,
                    "mixed_precision": True,
                    "fp16_type": "bfloat16",
                    "loss_weight": 1 / 2048,
                },
                "optimizer": {"AdamW": {"betas": [0.9, 0.95]}},
                "schedulers": [
                    {
                        "SequentialLR": {
                            "schedulers": [
                                {
                                    "LinearLR": {
                                        "initial_learning_rate": 0.0,
                                        "end_learning_rate": 6e-4,
                                        "total_iters": 1525,
                                    }
                                },
                                {
                                    "LinearLR": {
                                        "initial_learning_rate": 6e-4,
                                        "end_learning_rate": 6e-5,
                                        "total_iters": 7512,
                                    }
                                },
                            ]
                        }
                    }
                ],
                "precision": {"enabled": True, "fp16_type": "bfloat16", "max_gradient_norm": 1.0},
                "loop": {"max_steps": 9037, "eval_frequency": 903, "eval_steps": 1546},
                "checkpoint": {"steps": 903},
            },
            "fit": {"train_dataloader": dict(loader), "val_dataloader": dict(loader)},
            "validate": {"val_dataloader": dict(loader)},
            "validate_all": {"val_dataloaders": dict(loader)},
        }
    }
    lines = {line.line: line for line in tool.RELEASE_LINES}
    (gpt2,) = lines["2.4"].models
    assert "gpt2/run.py" in gpt2.run_py and "gpt3/configs" in gpt2.config
    params = gpt2.data(tmp_path, gpt2.build(shipped, tool.Settings()))
    init = params["trainer"]["init"]
    assert init["model"]["name"] == "gpt2" and init["model"]["num_hidden_layers"] == 2
    assert "mixed_precision" not in init["model"] and init["model"]["dropout_rate"] == 0
    assert init["model"]["loss_weight"] == 1 / 128  # 1 / the sequence length
    assert init["loop"] == {"max_steps": 20, "eval_frequency": 20, "eval_steps": 5}
    assert init["checkpoint"]["steps"] == 10
    phases = init["schedulers"][0]["SequentialLR"]["schedulers"]
    assert [p["LinearLR"]["total_iters"] for p in phases] == [10, 10]
    assert init["precision"]["enabled"] is True  # CSX: the shipped precision
    assert shipped["trainer"]["init"]["loop"]["max_steps"] == 9037  # the shipped one unchanged
    trainer = params["trainer"]
    train = trainer["fit"]["train_dataloader"]["data_dir"]
    evals = {
        trainer["fit"]["val_dataloader"]["data_dir"],
        trainer["validate"]["val_dataloader"]["data_dir"],
        trainer["validate_all"]["val_dataloaders"]["data_dir"],
    }
    assert len(evals) == 1 and train not in evals
    import h5py

    with h5py.File(next(Path(train).glob("*.h5"))) as f:
        assert f["data"].shape == (4 * 20 * 2, 3, 128)
        assert f["data"][:, 0].max() < init["model"]["vocab_size"]
    cpu = gpt2.cpu_params(params)
    assert cpu["trainer"]["init"]["precision"] == {
        "enabled": False,
        "fp16_type": "bfloat16",
        "max_gradient_norm": 1.0,
    }
