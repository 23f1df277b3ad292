"""A Model Zoo 1.x model directory copied into a ``modelzoo/<model>/pytorch/`` tree of the
user's own runs unchanged with ``python run.py ...``; a real Model Zoo checkout (a regular
``modelzoo`` package) shadows this one entirely."""

import os
import sys
import textwrap

import pytest

import cstorch
from tests import fork_server

COMPAT = os.path.join(os.path.dirname(__file__), "..", "..", "compat")

RUN_PY = """\
import os
import sys

sys.path.append(os.path.join(os.path.dirname(__file__), "../../.."))
from modelzoo.common.pytorch.run_utils import run
from modelzoo.toy.pytorch.model import ToyModel
from modelzoo.toy.pytorch.data import get_train_dataloader, get_eval_dataloader


def main():
    run(ToyModel, get_train_dataloader, get_eval_dataloader)


if __name__ == "__main__":
    main()
"""

MODEL_PY = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

from modelzoo.common.pytorch.metrics import AccuracyMetric
from modelzoo.common.pytorch.run_utils import half_dtype_instance


class ToyModel(nn.Module):
    def __init__(self, params):
        super().__init__()
        dtype = half_dtype_instance.half_dtype if params["model"]["to_float16"] else torch.float32
        self.fc = nn.Linear(6, 3).to(dtype)
        self.accuracy = AccuracyMetric(name="accuracy")

    def __call__(self, data):
        inputs, labels = data
        logits = self.fc(inputs)
        if not self.training:
            self.accuracy(labels=labels.clone(), predictions=logits.argmax(-1))
        return F.nll_loss(F.log_softmax(logits, dim=1), labels)
"""

DATA_PY = """\
import torch

from modelzoo.common.pytorch import cb_model as cm
from modelzoo.common.pytorch.utils import SampleGenerator, get_input_dtype


def _data(params, key):
    p = params[key]
    dtype = get_input_dtype(p.get("to_float16", False))
    return SampleGenerator(
        data=(torch.ones(p["batch_size"], 6, dtype=dtype),
              torch.zeros(p["batch_size"], dtype=torch.int32 if cm.use_cs() else torch.int64)),
        sample_count=5)


def get_train_dataloader(params):
    return _data(params, "train_input")


def get_eval_dataloader(params):
    return _data(params, "eval_input")
"""

PARAMS = """\
train_input: {batch_size: 4, use_fake_data: true}
eval_input: {batch_size: 4, use_fake_data: true}
model: {mixed_precision: true, to_float16: false}
optimizer: {optimizer_type: SGD, learning_rate: 0.1, momentum: 0.9, loss_scaling_factor: 1.0}
runconfig: {max_steps: 4, checkpoint_steps: 2, log_steps: 1, seed: 1, save_losses: true}
"""


def _user_tree(root):
    model_dir = root / "modelzoo" / "toy" / "pytorch"
    (model_dir / "configs").mkdir(parents=True)
    for name, text in (
        ("__init__.py", ""),
        ("run.py", RUN_PY),
        ("model.py", MODEL_PY),
        ("data.py", DATA_PY),
        ("configs/params.yaml", PARAMS),
    ):
        (model_dir / name).write_text(text)
    (root / "modelzoo" / "toy" / "__init__.py").write_text("")
    return model_dir


def _python(args, cwd, extra_path=()):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(list(extra_path) + [env.get("PYTHONPATH", "")])
    return fork_server.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_user_model_tree_runs_unchanged(tmp_path):
    model_dir = _user_tree(tmp_path)
    result = _python(
        ["run.py", "CPU", "--params", "configs/params.yaml", "--mode", "train"], cwd=model_dir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = model_dir / "model_dir"
    assert (out / "checkpoint_2.mdl").exists() and (out / "checkpoint_4.mdl").exists()
    assert "Step=4" in result.stdout + result.stderr
    state = cstorch.load(str(out / "checkpoint_4.mdl"))
    assert state["global_step"] == 4 and set(state["model"]) == {"fc.weight", "fc.bias"}


def test_namespace_portions_and_shadowing(tmp_path):
    # No __init__.py in modelzoo/ and modelzoo/common/: they are namespace portions.
    assert not os.path.exists(os.path.join(COMPAT, "modelzoo", "__init__.py"))
    assert not os.path.exists(os.path.join(COMPAT, "modelzoo", "common", "__init__.py"))
    # A real Model Zoo checkout (a regular package) earlier on the path wins entirely.
    zoo = tmp_path / "zoo" / "modelzoo"
    (zoo / "common" / "pytorch").mkdir(parents=True)
    (zoo / "__init__.py").write_text("REAL = True\n")
    (zoo / "common" / "__init__.py").write_text("")
    (zoo / "common" / "pytorch" / "__init__.py").write_text("")
    code = textwrap.dedent("""
        import modelzoo, importlib.util
        print(getattr(modelzoo, "REAL", False),
              importlib.util.find_spec("modelzoo.common.pytorch.run_utils") is not None)
    """)
    result = _python(["-c", code], cwd=tmp_path, extra_path=[str(tmp_path / "zoo")])
    assert result.stdout.split() == ["True", "False"], result.stderr[-2000:]
