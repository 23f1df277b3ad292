"""Multi-process jobs on jax.distributed (issue 16), each process a subprocess modeling two
CPU devices, coordinator on 127.0.0.1; every wait is bounded.

Oracle: the same training on one process and one device (fp32 policy)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from cstorch.distributed import launch
from tests.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.core]  # multi-process jobs

PYTHON = sys.executable
DRIVER = os.path.join(os.path.dirname(__file__), "distributed_run.py")
EXAMPLE = os.path.join(REPO, "examples", "gpt_adamw.py")
TIMEOUT = 300


def _env(devices=1, **extra):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "compat")]),
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        PYTHONUNBUFFERED="1",
    )
    for name in list(env):
        if name.startswith("CSTORCH_"):
            del env[name]
    env.update(extra)
    return env


def _run(args, cwd, env):
    out = subprocess.run(
        [PYTHON, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=TIMEOUT
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def _launch(args, cwd, devices_per_process=2):
    return _run(
        [
            "-m",
            "cstorch.distributed.launch",
            "--num_processes",
            "2",
            "--devices_per_process",
            str(devices_per_process),
            *args,
        ],
        cwd,
        _env(),
    )


def _result(stdout):
    lines = [s for s in stdout.splitlines() if s.startswith("RESULT ")]
    assert len(lines) == 1, stdout[-3000:]  # printed by process 0 only
    return json.loads(lines[0][7:])


def _losses(stdout):
    return [float(x) for x in re.findall(r"^step +\d+ +loss (\S+)", stdout, re.M)]


@pytest.mark.heavy
def test_gpt_example_on_two_processes_matches_one_device(tmp_path):
    args = [
        EXAMPLE,
        "--backend",
        "CSX",
        "--layers",
        "1",
        "--d-model",
        "32",
        "--seq-len",
        "16",
        "--batch-size",
        "8",
        "--steps",
        "4",
        "--log-every",
        "1",
        "--artifact-dir",
        str(tmp_path / "artifacts"),
    ]
    single = _losses(_run(args, tmp_path, _env()))
    job = _losses(_launch(args + ["--num-csx", "4", "--weight-servers", "1"], tmp_path))
    assert len(single) == 4
    assert job == pytest.approx(single, rel=1e-5)  # each step printed once (process 0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The MLP trained for 6 steps on one process and one device, checkpointed at step 3."""
    cwd = tmp_path_factory.mktemp("reference")
    run = _result(
        _run(
            [
                DRIVER,
                json.dumps(
                    {"num_csx": 1, "steps": 6, "save_at": 3, "ckpt": str(cwd / "step3.mdl")}
                ),
            ],
            cwd,
            _env(),
        )
    )
    return dict(run, ckpt=str(cwd / "step3.mdl"))


@pytest.mark.heavy
def test_checkpoints_move_between_one_process_and_a_two_dimensional_job(tmp_path, reference):
    """One process → 2 processes (a 2 × 2 mesh, state split four ways) → one process."""
    ckpt = str(tmp_path / "step5.mdl")
    job = _result(
        _launch(
            [
                DRIVER,
                json.dumps(
                    {
                        "num_csx": 2,
                        "weight_servers": 2,
                        "steps": 6,
                        "resume": reference["ckpt"],
                        "start": 3,
                        "save_at": 5,
                        "ckpt": ckpt,
                    }
                ),
            ],
            tmp_path,
        )
    )
    assert job["processes"] == 2 and job["mesh"] == {"csx": 2, "ws": 2}
    assert job["devices"] == 4 and job["spec"] == [["csx", "ws"]]
    assert job["local_shard_rows"] == 32 // 4  # each device holds a quarter of the weight
    assert job["losses"] == pytest.approx(reference["losses"][3:], rel=1e-5)
    for name, value in reference["final"].items():
        np.testing.assert_allclose(job["final"][name], value, rtol=1e-4, atol=1e-6)
    assert os.path.exists(ckpt)  # one file, written by process 0 from gathered values

    resumed = _result(
        _run(
            [DRIVER, json.dumps({"num_csx": 1, "steps": 6, "resume": ckpt, "start": 5})],
            tmp_path,
            _env(),
        )
    )
    assert resumed["processes"] == 1
    assert resumed["losses"] == pytest.approx(reference["losses"][5:], rel=1e-5)
    for name, value in reference["final"].items():
        np.testing.assert_allclose(resumed["final"][name], value, rtol=1e-4, atol=1e-6)


def test_two_dimensional_mesh_in_one_process(tmp_path, reference):
    """num_csx=2 × 2 weight-server devices: each device keeps a quarter of the state and XLA
    moves parameter and gradient pieces instead (within ZeRO-3's bound: gather the
    parameters twice, reduce the gradients once)."""
    run = _result(
        _run(
            [DRIVER, json.dumps({"num_csx": 2, "weight_servers": 2, "steps": 6, "hlo": True})],
            tmp_path,
            _env(devices=4),
        )
    )
    assert run["mesh"] == {"csx": 2, "ws": 2} and run["spec"] == [["csx", "ws"]]
    assert run["local_shard_rows"] == 32 // 4
    assert run["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    moved = sum(b for _, b in run["communication"].values())
    assert 0 < moved <= 3 * run["param_bytes"] + 256


def _job_env(process_id, port, **extra):
    return _env(
        devices=2,
        CSTORCH_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        CSTORCH_NUM_PROCESSES="2",
        CSTORCH_PROCESS_ID=str(process_id),
        **extra,
    )


@pytest.mark.parametrize("victim", [1, 0])
@pytest.mark.heavy
def test_killing_one_process_makes_the_other_fail_within_60_s(tmp_path, victim):
    """Process 1 dying: the survivor's next step raises PeerFailureError and it exits with
    status 1. Process 0 (which hosts the coordinator) dying: that, or the runtime stops the
    other as it lost the coordinator."""
    port = launch.free_port()
    options = json.dumps(
        {"num_csx": 4, "weight_servers": 1, "steps": 400, "die_at": 3, "die_rank": victim}
    )
    processes = [
        subprocess.Popen(
            [PYTHON, DRIVER, options],
            cwd=tmp_path,
            env=_job_env(i, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    survivor = processes[1 - victim]
    try:
        processes[victim].communicate(timeout=TIMEOUT)
        died = time.monotonic()
        assert processes[victim].returncode == -9  # it killed itself at step 3
        _, stderr = survivor.communicate(timeout=60)
        assert time.monotonic() - died < 60
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert survivor.returncode != 0, stderr[-3000:]
    ours = "PeerFailureError" in stderr and "another process of the job died" in stderr
    if victim == 1:
        assert ours and survivor.returncode == 1, stderr[-3000:]
    else:  # whichever notices first: the failed collective or the lost coordinator
        assert ours or "another task died" in stderr, stderr[-3000:]


@pytest.mark.heavy
def test_a_process_that_never_joins_is_a_clear_error_in_bounded_time(tmp_path):
    start = time.monotonic()
    out = subprocess.run(
        [PYTHON, DRIVER, json.dumps({"num_csx": 2, "steps": 1})],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=_job_env(0, launch.free_port(), CSTORCH_INIT_TIMEOUT="5"),
    )
    assert out.returncode != 0
    assert "DistributedError" in out.stderr and "could not join" in out.stderr
    assert time.monotonic() - start < 120


def test_compiled_step_all_reduces_the_gradients_once(tmp_path):
    """Data parallelism with replicated state: the compiled step all-reduces the gradients
    (P bytes) once, plus a few scalars."""
    run = _result(
        _run(
            [DRIVER, json.dumps({"num_csx": 4, "steps": 1, "hlo": True})], tmp_path, _env(devices=4)
        )
    )
    p = run["param_bytes"]
    assert run["spec"] == [] and p <= run["communication"]["all-reduce"][1] <= p + 64
