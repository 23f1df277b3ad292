"""``python -m cstorch.storage info|convert``."""

import os
import sys

import pytest
import torch

import cstorch.storage as storage
from cstorch.storage import cli, safetensors_format
from tests import fork_server
from tests.paths import REPO


@pytest.fixture
def checkpoint(tmp_path):
    t = torch.randn(4, 8)
    state = {
        "model": {"fc.weight": t, "fc.bias": torch.zeros(8).bfloat16()},
        "tied": t,
        "step": 12,
        "name": "run",
        "none": None,
        "dtype": torch.float16,
    }
    path = tmp_path / "c.mdl"
    storage.save(state, path)
    return path, state


def test_info_lists_keys_dtypes_shapes_and_total(checkpoint, capsys, monkeypatch):
    path, _ = checkpoint
    reads = []
    monkeypatch.setattr(
        storage.load.__globals__["H5Reader"], "read_array", lambda self, key: reads.append(key)
    )
    assert cli.main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "model/" in out
    assert "fc.weight" in out and "float32" in out and "[4, 8]" in out and "128 B" in out
    assert "fc.bias" in out and "bfloat16" in out and "16 B" in out
    assert "-> model.fc.weight" in out  # the tie
    assert "object (pickled)" in out
    assert "total: 7 leaves, 2 arrays" in out  # 128 + 16 tensor bytes + the pickle
    assert reads == []  # metadata only


def test_convert_to_safetensors(checkpoint, tmp_path, capsys):
    path, state = checkpoint
    out = tmp_path / "c.safetensors"
    assert cli.main(["convert", str(path), str(out)]) == 0
    tensors = safetensors_format.read(out)
    assert torch.equal(tensors["model.fc.weight"], state["model"]["fc.weight"])
    assert tensors["model.fc.bias"].dtype == torch.bfloat16 and torch.equal(
        tensors["tied"], state["tied"]
    )
    assert safetensors_format.read_metadata(out) == {"step": "12", "name": '"run"', "none": "null"}
    assert "skipped 'dtype'" in capsys.readouterr().err
    assert cli.main(["convert", str(path), str(out)]) == 1  # never overwrites


def test_convert_to_torch_pickle_keeps_ties(checkpoint, tmp_path):
    path, state = checkpoint
    out = tmp_path / "c.pt"
    assert cli.main(["convert", str(path), str(out)]) == 0
    loaded = torch.load(out)
    assert loaded["tied"] is loaded["model"]["fc.weight"]
    assert loaded["step"] == 12 and loaded["dtype"] == torch.float16
    assert type(loaded["tied"]) is torch.Tensor


@pytest.mark.slow
def test_module_entry_point(checkpoint):
    path, _ = checkpoint
    env = dict(os.environ, PYTHONPATH=REPO)
    result = fork_server.run(
        [sys.executable, "-m", "cstorch.storage", "info", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "fc.weight" in result.stdout
    missing = fork_server.run(
        [sys.executable, "-m", "cstorch.storage", "info", str(path) + ".nope"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert missing.returncode == 1 and "does not exist" in missing.stderr
