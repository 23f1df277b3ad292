"""The tests' fork server (tests/fork_server.py) gives a command what a fresh process gives it:
each probe runs both ways, ``subprocess.run`` being the reference."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests import fork_server

pytestmark = [pytest.mark.slow, pytest.mark.core]  # a server start; every stack uses it

PROBE = textwrap.dedent("""
    import json, os, sys, warnings
    import numpy
    print(json.dumps({
        "argv": sys.argv,
        "path": sys.path,
        "cwd": os.getcwd(),
        "name": __name__,
        "file": globals().get("__file__"),
        "main_is_this": sys.modules["__main__"].__dict__ is globals(),
        "marker": os.environ.get("FORK_SERVER_PROBE"),
        "warnings": sys.warnoptions,
        "stdin": sys.stdin.read(),
        "torch_loaded": "torch" in sys.modules,
    }))
    print("to stderr", file=sys.stderr)
    warnings.warn("a user warning")
""")


def _both(argv, **kwargs):
    kwargs = dict(capture_output=True, text=True, timeout=300, **kwargs)
    real = subprocess.run(argv, stdin=subprocess.DEVNULL, **kwargs)
    forked = fork_server.run(argv, **kwargs)
    return real, forked


def _same(real, forked):
    import json

    assert forked.returncode == real.returncode == 0, forked.stderr + real.stderr
    real_out, forked_out = json.loads(real.stdout), json.loads(forked.stdout)
    assert forked_out.pop("torch_loaded") and not real_out.pop("torch_loaded")  # it was forked
    assert forked_out == real_out
    assert forked.stderr.splitlines()[0] == real.stderr.splitlines()[0] == "to stderr"


@pytest.mark.parametrize("how", ["script", "-c", "-m"])
def test_a_child_sees_the_commands_argv_path_directory_and_environment(tmp_path, how):
    (tmp_path / "lib").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "lib" / "probe_module.py").write_text(PROBE)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    target = {
        "script": [str(script)],
        "-c": ["-c", PROBE],
        "-m": ["-m", "probe_module"],
    }[how]
    env = dict(
        os.environ,
        FORK_SERVER_PROBE=how,
        PYTHONPATH=os.pathsep.join([str(tmp_path / "lib"), "relative"]),
    )
    real, forked = _both(
        [sys.executable, "-W", "error::DeprecationWarning", *target, "a", "--b"],
        cwd=tmp_path / "work",
        env=env,
    )
    _same(real, forked)


def test_exit_codes_tracebacks_and_signals_are_a_processs():
    for code, status in [
        ("raise SystemExit(3)", 3),
        ("1/0", 1),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -15),
        ("import atexit; atexit.register(print, 'at exit')", 0),
    ]:
        real, forked = _both([sys.executable, "-c", code])
        assert forked.returncode == real.returncode == status, code
        assert forked.stdout == real.stdout
        assert forked.stderr.splitlines()[-1:] == real.stderr.splitlines()[-1:]


def test_a_timeout_kills_the_child_and_raises_as_subprocess_does(tmp_path):
    marker = tmp_path / "still running"
    code = f"import time; time.sleep(5); open({str(marker)!r}, 'w')"
    with pytest.raises(subprocess.TimeoutExpired):
        fork_server.run([sys.executable, "-c", code], timeout=0.5)
    import time

    time.sleep(6)
    assert not marker.exists()


def test_a_different_start_up_environment_gets_its_own_server_or_a_real_process(monkeypatch):
    code = "import os, sys; print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)"
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    result = fork_server.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.stdout.split() == ["PASSIVE", "True"]  # a server started with that setting
    assert dict(fork_server._start_up_environment(env))["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setattr(fork_server, "MAX_SERVERS", len(fork_server._servers))
    env = dict(os.environ, OMP_WAIT_POLICY="ACTIVE")
    result = fork_server.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.stdout.split() == ["ACTIVE", "False"]  # no room for a server: a real process
