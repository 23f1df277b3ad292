"""A writer killed mid-save leaves the target path absent (never a half-written checkpoint)."""

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import cstorch.storage as storage
from tests.paths import REPO

pytestmark = pytest.mark.slow  # writers killed in subprocesses

WRITER = textwrap.dedent("""
    import sys, torch
    import cstorch.storage as storage
    torch.manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(1024, 2048) for i in range(48)}  # 384 MiB
    print("ready", flush=True)
    storage.save(state, sys.argv[1])
    print("done", flush=True)
""")


def _start_writer(target):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_sigkill_mid_save_leaves_no_checkpoint(tmp_path):
    target = tmp_path / "killed.mdl"
    proc = _start_writer(target)
    deadline = time.monotonic() + 60
    temp = []
    # Kill once the temporary file holds some data but well before the save can finish.
    while time.monotonic() < deadline and proc.poll() is None:
        temp = glob.glob(f"{target}.*.tmp")
        if temp and os.path.getsize(temp[0]) > 16 << 20:
            break
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    if proc.returncode == 0:
        pytest.skip("the save finished before it could be killed (machine too fast)")
    assert not target.exists()
    assert temp and os.path.exists(temp[0])
    with pytest.raises(FileNotFoundError):
        storage.load(target)
    with pytest.raises(RuntimeError, match=os.path.basename(temp[0])):
        storage.load(temp[0])  # the leftover is recognised as incomplete, by name


def test_uninterrupted_writer_publishes_complete_checkpoint(tmp_path):
    target = tmp_path / "complete.mdl"
    proc = _start_writer(target)
    assert proc.stdout.readline().strip() == "done"
    assert proc.wait() == 0
    proc.stdout.close()
    assert glob.glob(f"{target}.*.tmp") == []
    out = storage.load(target)
    torch.manual_seed(0)
    assert len(out) == 48
    assert torch.equal(out["layer0.weight"], torch.randn(1024, 2048))
