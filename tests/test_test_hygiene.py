"""The suite's own hygiene. It writes nothing to the user's home directory (no ``~/.cache``):
run a subset that compiles steps (so the persistent caches are used) and saves checkpoints with
HOME pointed at an empty directory, and look. Its lanes keep themselves: no hand-kept list of
tests, the fast lane fails an unmarked test over its CPU budget, and the compat and newest
legs select by marker."""

import os
import re
import shlex
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from tests import conftest
from tests.paths import REPO as ROOT


@pytest.mark.slow
def test_a_test_run_creates_nothing_in_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XDG_CACHE_HOME", "CSTORCH_COMPILATION_CACHE", "CSTORCH_GRAPH_CACHE")
    }
    env.update(HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/cstorch/core/test_trace.py",
            "tests/cstorch/storage/test_storage_roundtrip.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    created = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert created == [], f"the tests wrote to HOME: {created[:20]}"


LANES = ("test", "test-fast", "test-compat", "test-newest")


def _lane_commands() -> dict:
    """The pytest command line of each of the Makefile's test lanes, variables expanded."""
    text = (Path(ROOT) / "Makefile").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^([A-Z_]+) :?= (.*)$", text, re.M))
    commands = {}
    for target, recipe in re.findall(r"^([a-z-]+):[^\n]*\n((?:\t.*\n)+)", text, re.M):
        for line in recipe.splitlines():
            if target in LANES and " -m pytest " in line:
                for _ in range(3):
                    line = re.sub(r"\$\(([A-Z_]+)\)", lambda m: variables.get(m.group(1), ""), line)
                commands[target] = shlex.split(line)
    return commands


def test_lanes_select_by_marker_not_by_a_list():
    assert not os.path.exists(os.path.join(ROOT, "tests", "slow_tests.txt"))
    commands = _lane_commands()
    assert set(commands) == set(LANES), commands
    selections = {}
    for target, argv in commands.items():
        options = argv[argv.index("pytest") + 1 :]
        assert [a for a in options if not a.startswith("-")][:1] == ["tests"], argv
        paths = [a for a in options if "/" in a or a.endswith(".py")]
        assert paths == [], f"`make {target}` selects by a hand-kept path list: {argv}"
        selections[target] = options[options.index("-m") + 1] if "-m" in options else None
    assert selections["test"] is None and selections["test-fast"] == "not slow", selections
    assert selections["test-compat"] == "core and not heavy", selections
    assert selections["test-newest"] == "core and (not heavy or newest)", selections


def test_the_budget_is_checked_in_the_fast_lane_only():
    def config(markexpr):
        return types.SimpleNamespace(getoption=lambda name: markexpr)

    assert conftest._fast_lane(config("not slow"))
    assert conftest._fast_lane(config("core and not slow"))
    assert not conftest._fast_lane(config(""))  # make test
    assert not conftest._fast_lane(config("core"))  # the compat and newest legs


@pytest.mark.slow
def test_the_fast_lane_fails_an_unmarked_test_over_its_cpu_budget(tmp_path):
    # tests/conftest.py beside three tests that spend a fixed amount of CPU (not of wall time,
    # so a slow or busy machine changes nothing): the unmarked one over the budget fails and
    # names the marker, the marked one is left out, the cheap one passes.
    (tmp_path / "conftest.py").write_text((Path(ROOT) / "tests" / "conftest.py").read_text())
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    (tmp_path / "test_lane.py").write_text(
        textwrap.dedent("""
        import time
        import pytest

        def _burn(seconds):
            end = time.process_time() + seconds
            while time.process_time() < end:
                pass

        def test_unmarked_and_slow():
            _burn(0.6)

        @pytest.mark.slow
        def test_marked_slow():
            _burn(0.6)

        def test_cheap():
            pass
    """)
    )
    env = dict(
        os.environ,
        CSTORCH_TEST_BUDGET="0.3",
        PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "compat")]),
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rf",
            "-m",
            "not slow",
            "test_lane.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = out.stdout + out.stderr
    assert out.returncode == 1, report
    assert "1 failed, 1 passed, 1 deselected" in report, report
    assert re.search(
        r"^test_lane.py::test_unmarked_and_slow spent \d+\.\d s of CPU in the fast "
        r"lane \(budget 0\.3 s.*mark it @pytest.mark.slow",
        report,
        re.M,
    ), report
