"""tools/zoo_generations.py without the zoo: checkout of a tag, config builders, log parsing
and the verdicts (the zoo runs themselves need MODELZOO_SRC: ``make zoo-generations``)."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("zoo_generations",
                                                  ROOT / "tools" / "zoo_generations.py")
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
    shipped = {"train_input": {"data_dir": "./mnist", "batch_size": 128},
               "eval_input": {"data_dir": "./mnist", "batch_size": 128},
               "model": {"mixed_precision": True, "fp16_type": "cbfloat16"},
               "runconfig": {"max_steps": 100000, "checkpoint_steps": 5000}}
    params = tool.fc_mnist_params(shipped, tool.Settings())
    assert params["train_input"]["use_fake_data"] and params["eval_input"]["batch_size"] == 4
    assert params["runconfig"]["max_steps"] == 20 and params["runconfig"]["checkpoint_steps"] == 10
    assert shipped["runconfig"]["max_steps"] == 100000  # the shipped config is not changed
    cpu = tool.float32(params)
    assert cpu["model"]["mixed_precision"] is False and "fp16_type" not in cpu["model"]
    assert params["model"]["fp16_type"] == "cbfloat16"  # CSX keeps the shipped precision


def test_first_error_and_log_losses(tmp_path):
    tool = _tool()
    log = ("| Train Device=CPU, Step=1, Loss=2.50000, Rate=1\n"
           "| Train Device=CPU, Step=2, Loss=2.25000, Rate=1\n"
           "Avg Eval Loss: 2.125\n"
           "Traceback (most recent call last):\n"
           '  File "/x/zoo/run_cstorch_flow.py", line 69, in <module>\n'
           "    from cerebras.pytorch.core import modes\n"
           "ImportError: cannot import name 'modes'\n\n"
           "During handling of the above exception, another exception occurred:\n\n"
           "Traceback (most recent call last):\n"
           '  File "/x/zoo/run.py", line 3, in <module>\n'
           "RuntimeError: later\n")
    assert tool.first_error(log) == "run_cstorch_flow.py:69: ImportError: cannot import name 'modes'"
    assert tool.first_error("all good") is None
    losses, eval_loss = tool.losses_2x(tmp_path, log)
    assert losses == {1: 2.5, 2: 2.25} and eval_loss == 2.125


def test_verdicts():
    tool = _tool()
    s = tool.Settings(steps=4, checkpoint_steps=2)
    curve = {1: 2.0, 2: 1.9, 3: 1.8, 4: 1.7}

    def run(losses, eval_loss=None, rc=0):
        return dict(rc=rc, losses=losses, eval_loss=eval_loss, error=None, project_cstorch=True)

    runs = {"cpu": run(curve, 1.6), "eager": run({**curve, 4: 1.7 * (1 + 2e-6)}),
            "csx": run({k: v * 1.001 for k, v in curve.items()}), "eval": run({}, 1.6),
            "resume": run({3: 1.8, 4: 1.7})}
    verdict = tool.judge(runs, s)
    assert [verdict[k].split()[0] for k in ("cpu", "csx", "eval", "resume", "vs_eager")] == \
        ["ok"] * 5
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
