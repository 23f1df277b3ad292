"""Test-wide settings: caches in a temporary directory, strict dtype promotion, deterministic
torch, checked state transitions.

JAX's 64-bit types stay off, as in a user's process: the engine turns them on for its own
work only (``jax_backend.jax_settings``), and the suite checks that it does so everywhere.
Tests never write to ``~/.cache``: the persistent caches, and anything else that follows
``XDG_CACHE_HOME``, live under the system's temporary directory
(``cstorch-jax-tests-<uid>``), kept between runs so that a rerun finds its compiled programs
(entries are keyed by the program and the versions, never stale; safe to delete).
"""

import os
import tempfile

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


# ---------------------------------------------------------------------------- the fast lane
_SLOW_LIST = os.path.join(os.path.dirname(__file__), "slow_tests.txt")


def _slow_ids() -> set:
    with open(_SLOW_LIST) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


# The project's own packages: a deprecation warning attributed to one of them (its code calls
# something torch or JAX deprecates) fails the test under CSTORCH_TEST_DEPRECATIONS=error, as
# JAX's own CI runs its tests (`make test-newest` sets it); warnings attributed to torch, JAX
# or the tests themselves are left as they are.
PROJECT_MODULES = r"(cstorch|jax_backend|cerebras|cerebras_pytorch|modelzoo)(\.|$)"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: left out by `make test-fast` (listed in tests/slow_tests.txt)")
    if os.environ.get("CSTORCH_TEST_DEPRECATIONS") == "error":
        for category in ("DeprecationWarning", "FutureWarning"):
            config.addinivalue_line("filterwarnings", f"error::{category}:{PROJECT_MODULES}")


def pytest_collection_modifyitems(config, items):
    slow = _slow_ids()
    root = str(config.rootpath)
    for item in items:
        nodeid = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        nodeid = nodeid + item.nodeid[item.nodeid.index("::"):] if "::" in item.nodeid else nodeid
        file_id, _, rest = nodeid.partition("::")
        if ({nodeid, nodeid.split("[")[0], file_id} & slow
                or any(f"{file_id}::{cls}" in slow for cls in rest.split("::")[:1])):
            item.add_marker(pytest.mark.slow)
