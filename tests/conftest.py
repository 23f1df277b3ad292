"""Test-wide settings: caches in a temporary directory, strict dtype promotion, deterministic
torch, checked state transitions, a fresh cstorch state per test, and the lanes (the fast
lane's CPU budget; ``slow``, ``core`` and ``heavy`` in pyproject's markers).

JAX's 64-bit types stay off, as in a user's process: the engine turns them on for its own
work only (``jax_backend.jax_settings``), and the suite checks that it does so everywhere.
Tests never write to ``~/.cache``: the persistent caches, and anything else that follows
``XDG_CACHE_HOME``, live under the system's temporary directory
(``cstorch-jax-tests-<uid>``), kept between runs so that a rerun finds its compiled programs
(entries are keyed by the program and the versions, never stale; safe to delete).
"""

import os
import tempfile
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
_cache_home = os.path.join(tempfile.gettempdir(), f"cstorch-jax-tests-{os.getuid()}")
os.makedirs(_cache_home, exist_ok=True)
os.environ["XDG_CACHE_HOME"] = _cache_home  # subprocesses of tests inherit it
os.environ.pop("CSTORCH_COMPILATION_CACHE", None)  # the default: under XDG_CACHE_HOME
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")
# Tests patch library code in ways the graph cache cannot see (it keys on source files, not
# on objects swapped at run time): no test reuses another's graph; the cache's own tests opt
# in. CSTORCH_TEST_GRAPH_CACHE=DIR runs the suite with the cache on, to check that hits
# change nothing.
os.environ["CSTORCH_GRAPH_CACHE"] = os.environ.get("CSTORCH_TEST_GRAPH_CACHE", "off")
# Every state tensor's bookkeeping is checked against its table of legal transitions
# (jax_backend/state.py, TRANSITIONS): an engine bug fails the test that meets it.
os.environ.setdefault("CSTORCH_DEBUG_STATE", "1")

import jax  # noqa: E402

# Strict dtype promotion: a lowering that mixes dtypes without an explicit cast fails here
# instead of silently computing in a promoted dtype (the engine itself runs with JAX's
# default promotion; torch's result dtypes are enforced node by node either way).
jax.config.update("jax_numpy_dtype_promotion", "strict")
import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# ------------------------------------------------------------- a fresh cstorch state per test
# The backend, mixed precision, metrics and the 1.8 API's once-per-process ``configure`` are
# process singletons (``cstorch.config.reset``); backends put their artifacts in the working
# directory. Every test of the API, the Trainer and the compatibility layer starts from a reset
# state in its own directory; the engine's (tests/jax_backend) and the repository-wide ones
# (tests/*.py) need neither.
_FRESH_STATE_DIRECTORIES = ("cstorch", "trainer", "compat")


@pytest.fixture(autouse=True)
def _fresh_cstorch_state(request):
    if not any(request.path.is_relative_to(_TESTS / d) for d in _FRESH_STATE_DIRECTORIES):
        yield
        return
    import cstorch

    if request.path.is_relative_to(_TESTS / "compat"):
        import cerebras_pytorch.experimental  # noqa: F401  (registers its reset hooks)
    request.getfixturevalue("monkeypatch").chdir(request.getfixturevalue("tmp_path"))
    cstorch.config.reset()
    yield
    cstorch.config.reset()


@pytest.fixture
def cpu_backend(tmp_path):
    import cstorch

    return cstorch.backend("CPU", artifact_dir=str(tmp_path))


# ---------------------------------------------------------------------------- the fast lane
# `make test-fast` (``-m "not slow"``) leaves out the tests marked ``slow`` where they are
# written: ``@pytest.mark.slow`` on a test (or ``pytest.param(..., marks=...)`` on one case),
# ``pytestmark = pytest.mark.slow`` on a module whose every test starts processes or trains.
# The lane keeps itself: in it, an unmarked test whose setup and call spend more than
# CSTORCH_TEST_BUDGET seconds of CPU (default 5; 0 turns the check off) fails, naming the
# marker. CPU time (this process's threads plus the subprocesses it waited for), not wall
# time: a busy machine stretches wall time, not the work a test does, so the check does not
# depend on the machine's load; the budget is five times the "about a second" rule for marking
# a test slow, so a slower machine still passes. `make test` runs everything and never checks.
_BUDGET = float(os.environ.get("CSTORCH_TEST_BUDGET", "5"))


@pytest.hookimpl(tryfirst=True)  # before -m selects
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("heavy"):  # the legs' kind of slow (pyproject's markers)
            item.add_marker(pytest.mark.slow)


def _fast_lane(config) -> bool:
    return "not slow" in (config.getoption("markexpr") or "") and _BUDGET > 0


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


_CPU_AT_SETUP = pytest.StashKey[float]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_SETUP] = _cpu_seconds()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    start = item.stash.get(_CPU_AT_SETUP, None)
    if start is not None and _fast_lane(item.config) and item.get_closest_marker("slow") is None:
        spent = _cpu_seconds() - start
        if spent > _BUDGET:
            pytest.fail(
                f"{item.nodeid} spent {spent:.1f} s of CPU in the fast lane (budget "
                f"{_BUDGET:g} s, CSTORCH_TEST_BUDGET): mark it @pytest.mark.slow, or make it "
                f"cheaper",
                pytrace=False,
            )
    return result


# The project's own packages: a deprecation warning attributed to one of them (its code calls
# something torch or JAX deprecates) fails the test under CSTORCH_TEST_DEPRECATIONS=error, as
# JAX's own CI runs its tests (`make test-newest` sets it); warnings attributed to torch, JAX
# or the tests themselves are left as they are.
PROJECT_MODULES = r"(cstorch|jax_backend|cerebras|cerebras_pytorch|modelzoo)(\.|$)"


def pytest_configure(config):
    if os.environ.get("CSTORCH_TEST_DEPRECATIONS") == "error":
        for category in ("DeprecationWarning", "FutureWarning"):
            config.addinivalue_line("filterwarnings", f"error::{category}:{PROJECT_MODULES}")
