"""Test-wide settings: JAX with 64-bit types (as the engine runs it), deterministic torch."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")

import jax_backend  # noqa: E402,F401  (enables x64 before any test imports jax.numpy)
import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
