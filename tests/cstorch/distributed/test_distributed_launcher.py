"""The launcher owns its processes (issue 23): a signal to the launcher stops every worker,
workers end when the launcher dies, and a busy coordinator port is a clear error instead of
the runtime's SIGSEGV. Every wait is bounded.

Issue 31: the same holds once the workers have joined a real JAX job and train (JAX's
preemption notifier, installed by the join, used to swallow SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from cstorch.distributed import runtime
from tests.paths import REPO

pytestmark = pytest.mark.core

PYTHON = sys.executable

# A worker that records its PID, then waits (ignoring SIGTERM and SIGHUP when asked to).
WORKER = textwrap.dedent("""
    import os, signal, sys, time
    if sys.argv[2] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    path = os.path.join(sys.argv[1], os.environ["CSTORCH_PROCESS_ID"])
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    time.sleep(300)
""")


def _env(**extra):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "compat")]),
        PYTHONUNBUFFERED="1",
    )
    for name in list(env):
        if name.startswith("CSTORCH_"):
            del env[name]
    env.update(extra)
    return env


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not yet reaped by its new parent, does
    not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _wait(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _start_launcher(tmp_path, mode="plain", grace=30):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    pids = tmp_path / "pids"
    pids.mkdir()
    launcher = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "cstorch.distributed.launch",
            "--num_processes",
            "2",
            "--grace",
            str(grace),
            str(script),
            str(pids),
            mode,
        ],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if not _wait(lambda: len(os.listdir(pids)) == 2, 120):
        launcher.kill()
        pytest.fail("the workers did not start: " + launcher.communicate()[1][-2000:])
    return launcher, [int((pids / name).read_text()) for name in ("0", "1")]


def _finish(launcher, workers):
    for pid in workers:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    if launcher.poll() is None:
        launcher.kill()
    return launcher.communicate()


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_every_worker(tmp_path):
    launcher, workers = _start_launcher(tmp_path, grace=30)
    try:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)  # forwarded at once, far within the 30 s grace
        assert _wait(lambda: not any(_alive(pid) for pid in workers), 10)
    finally:
        _, stderr = _finish(launcher, workers)
    assert launcher.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "SIGTERM: stopping the processes" in stderr


@pytest.mark.slow
@pytest.mark.heavy
def test_workers_ignoring_sighup_are_killed_after_the_grace(tmp_path):
    launcher, workers = _start_launcher(tmp_path, mode="stubborn", grace=1)
    try:
        start = time.monotonic()
        launcher.send_signal(signal.SIGHUP)
        launcher.wait(timeout=60)  # 1 s grace, SIGTERM (ignored), 5 s, SIGKILL
        assert not any(_alive(pid) for pid in workers)
        assert time.monotonic() - start < 30
    finally:
        _, stderr = _finish(launcher, workers)
    assert launcher.returncode == 128 + signal.SIGHUP, stderr[-2000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.slow
def test_workers_die_with_a_killed_launcher(tmp_path):
    launcher, workers = _start_launcher(tmp_path)
    try:
        launcher.kill()  # SIGKILL: the launcher cannot forward anything
        launcher.wait(timeout=30)
        assert _wait(lambda: not any(_alive(pid) for pid in workers), 20)
    finally:
        _finish(launcher, workers)


TRAINING = os.path.join(os.path.dirname(__file__), "launched_training.py")


def _progress(directory):
    """``{process id: (pid, last step)}`` the training workers reported."""
    found = {}
    for name in ("0", "1"):
        try:
            pid, step = (directory / name).read_text().split()
        except FileNotFoundError:
            continue
        found[name] = (int(pid), int(step))
    return found


def _start_job(tmp_path, mode, grace=30):
    """A launched 2-process CSX job (one CPU device each) that trains; returns once both
    workers have joined and done 5 steps. Their output goes to ``tmp_path/log``."""
    progress = tmp_path / "progress"
    progress.mkdir()
    log = open(tmp_path / "log", "w")
    launcher = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "cstorch.distributed.launch",
            "--num_processes",
            "2",
            "--grace",
            str(grace),
            TRAINING,
            str(progress),
            mode,
        ],
        cwd=tmp_path,
        env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=1"),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    started = _wait(
        lambda: (
            len(_progress(progress)) == 2
            and all(step >= 5 for _, step in _progress(progress).values())
        ),
        240,
    )
    workers = [pid for pid, _ in _progress(progress).values()]
    if not started:
        _finish(launcher, workers)
        pytest.fail("the job did not reach step 5: " + (tmp_path / "log").read_text()[-3000:])
    return launcher, workers


def _time_to_death(workers, limit=10.0):
    start = time.monotonic()
    gone = _wait(lambda: not any(_alive(pid) for pid in workers), limit)
    return time.monotonic() - start if gone else None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("mode", ["train", "block"])
@pytest.mark.slow
@pytest.mark.heavy
def test_joined_training_workers_die_with_a_killed_launcher(tmp_path, mode):
    """SIGKILL of the launcher at step 5 or later: training workers (``train``), or one
    waiting in a collective and one in user code that catches SIGTERM (``block``), are gone
    within 10 s."""
    launcher, workers = _start_job(tmp_path, mode)
    try:
        launcher.kill()
        launcher.wait(timeout=30)
        seconds = _time_to_death(workers)
        print(f"{mode}: workers gone {seconds} s after the launcher's SIGKILL")
        assert seconds is not None, "workers outlived their killed launcher by 10 s"
    finally:
        _finish(launcher, workers)


@pytest.mark.slow
@pytest.mark.heavy
def test_a_forwarded_sigterm_stops_joined_training_workers(tmp_path):
    """The launcher's own escalation (SIGTERM again after min(grace, 10) s, SIGKILL 5 s
    later) is not what stops them: the first SIGTERM does, and JAX does not catch it."""
    launcher, workers = _start_job(tmp_path, "train", grace=30)
    try:
        launcher.send_signal(signal.SIGTERM)
        seconds = _time_to_death(workers, limit=9.0)
        print(f"workers gone {seconds} s after SIGTERM to the launcher")
        assert seconds is not None, "workers outlived a forwarded SIGTERM by 9 s"
        launcher.wait(timeout=30)
    finally:
        _finish(launcher, workers)
    assert launcher.returncode == 128 + signal.SIGTERM
    assert "SIGTERM caught" not in (tmp_path / "log").read_text()


@pytest.mark.slow
def test_the_runtime_watch_ends_a_worker_whose_launcher_died(tmp_path):
    """Where the kernel cannot be asked (not Linux), the runtime's thread notices: a parent
    starts a child without PR_SET_PDEATHSIG, the child runs the watch, the parent is killed."""
    pid_file = tmp_path / "child"
    child = (
        "import os, sys, time; from cstorch.distributed import runtime; "
        "assert runtime.watch_launcher(interval=0.05); "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    )
    parent = (
        "import os, subprocess, sys, time; "
        f"env = dict(os.environ, {runtime.ENV_LAUNCHER_PID}=str(os.getpid())); "
        f"subprocess.Popen([sys.executable, '-c', {child!r}], env=env); time.sleep(300)"
    )
    process = subprocess.Popen([PYTHON, "-c", parent], cwd=REPO, env=_env())
    worker = None
    try:
        assert _wait(lambda: pid_file.exists() and pid_file.read_text(), 120)
        worker = int(pid_file.read_text())
        process.kill()
        process.wait(timeout=30)
        assert _wait(lambda: not _alive(worker), 20)
    finally:
        _finish(process, [worker] if worker else [])


def test_the_watch_is_only_for_the_launchers_own_children():
    assert not runtime.watch_launcher({})
    assert not runtime.watch_launcher({runtime.ENV_LAUNCHER_PID: str(os.getpid())})


@pytest.fixture
def busy_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.mark.slow
def test_a_busy_coordinator_port_is_a_clear_error_not_a_crash(tmp_path, busy_port):
    assert "cannot listen on port" in runtime.coordinator_port_in_use(f"127.0.0.1:{busy_port}")
    driver = os.path.join(os.path.dirname(__file__), "distributed_run.py")
    start = time.monotonic()
    out = subprocess.run(
        [PYTHON, driver, json.dumps({"num_csx": 4, "steps": 1})],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(
            CSTORCH_COORDINATOR_ADDRESS=f"127.0.0.1:{busy_port}",
            CSTORCH_NUM_PROCESSES="2",
            CSTORCH_PROCESS_ID="0",
            CSTORCH_INIT_TIMEOUT="60",
            XLA_FLAGS="--xla_force_host_platform_device_count=2",
        ),
    )
    assert out.returncode == 1, (out.returncode, out.stderr[-3000:])  # not -11 (SIGSEGV)
    assert "DistributedError" in out.stderr and f"port {busy_port}" in out.stderr
    assert time.monotonic() - start < 60  # before the init timeout: JAX never started


@pytest.mark.slow
def test_the_launcher_refuses_a_busy_port_before_starting_anything(tmp_path, busy_port):
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('started')\n")
    out = subprocess.run(
        [
            PYTHON,
            "-m",
            "cstorch.distributed.launch",
            "--num_processes",
            "2",
            "--port",
            str(busy_port),
            str(script),
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and f"cannot listen on port {busy_port}" in out.stderr
    assert "started" not in out.stderr


def test_a_free_port_passes_the_check():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert runtime.coordinator_port_in_use(f"127.0.0.1:{port}") is None
