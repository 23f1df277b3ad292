"""The test suite writes nothing to the user's home directory (no ``~/.cache``): run a subset
that compiles steps (so the persistent caches are used) and saves checkpoints with HOME
pointed at an empty directory, and look."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_test_run_creates_nothing_in_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_CACHE_HOME", "CSTORCH_COMPILATION_CACHE", "CSTORCH_GRAPH_CACHE")}
    env.update(HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/cstorch/test_trace.py", "tests/cstorch/test_storage_roundtrip.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    created = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert created == [], f"the tests wrote to HOME: {created[:20]}"
