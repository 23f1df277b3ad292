"""Test-wide settings: JAX with 64-bit types (as the engine runs it) and strict dtype
promotion, deterministic torch."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")
# Tests patch library code in ways the graph cache cannot see (it keys on source files, not
# on objects swapped at run time): no test reuses another's graph; the cache's own tests opt
# in. CSTORCH_TEST_GRAPH_CACHE=DIR runs the suite with the cache on, to check that hits
# change nothing.
os.environ["CSTORCH_GRAPH_CACHE"] = os.environ.get("CSTORCH_TEST_GRAPH_CACHE", "off")

import jax  # noqa: E402
import jax_backend  # noqa: E402,F401  (enables x64 before any test imports jax.numpy)

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
