"""tools/zoo_scan.py on a miniature zoo tree: what counts as a use and when it resolves."""

import json
import os
import sys
from pathlib import Path

import pytest

from tests import fork_server, paths

ROOT = Path(paths.REPO)

SOURCE = """
import torch.distributed as tdist
import cerebras.pytorch as cstorch
import cerebras.pytorch.distributed as dist
from cerebras.pytorch.utils.data import Schedule
from cerebras.pytorch.backend import BackendType
from cerebras.pytorch.utils.call_once import call_once

def f(model):
    cstorch.backends.csx.debug.debug_args.MergeFrom({})
    cstorch.optim.SGD(model.parameters(), lr=0.1).step()   # a call ends the chain
    BackendType.from_str("cpu")
    dist.get_streaming_batch_size(4)
    cstorch.utils.no_such_helper(1)
    return Schedule.Range

def g():
    import torch.distributed as dist   # rebinds `dist`: chains on it are ambiguous, left out
    return dist.get_rank()
"""


@pytest.mark.slow
def test_zoo_scan_counts_and_resolves_uses(tmp_path):
    package = tmp_path / "cerebras" / "modelzoo"
    package.mkdir(parents=True)
    (package / "mini.py").write_text(SOURCE)
    out = tmp_path / "scan.json"
    proc = fork_server.run(
        [sys.executable, str(ROOT / "tools" / "zoo_scan.py"), str(tmp_path), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": ""},
    )
    table = json.loads(out.read_text())
    assert sorted(table) == [
        "cerebras.pytorch",
        "cerebras.pytorch.backend.BackendType",
        "cerebras.pytorch.backend.BackendType.from_str",
        "cerebras.pytorch.backends.csx.debug.debug_args.MergeFrom",
        "cerebras.pytorch.distributed",
        "cerebras.pytorch.optim.SGD",
        "cerebras.pytorch.utils.call_once.call_once",
        "cerebras.pytorch.utils.data.Schedule",
        "cerebras.pytorch.utils.data.Schedule.Range",
        "cerebras.pytorch.utils.no_such_helper",
    ]
    missing = [use for use, entry in table.items() if entry["error"]]
    assert missing == ["cerebras.pytorch.utils.no_such_helper"]
    assert table["cerebras.pytorch.utils.call_once.call_once"]["kinds"] == ["import"]
    assert proc.returncode == 1 and "resolved 9/10 cerebras.pytorch uses" in proc.stdout


def test_zoo_scan_refuses_a_folder_without_the_zoo(tmp_path):
    proc = fork_server.run(
        [sys.executable, str(ROOT / "tools" / "zoo_scan.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "cerebras/modelzoo" in proc.stderr
