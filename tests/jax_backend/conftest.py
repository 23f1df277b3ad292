"""The engine's internals (the interpreter under a test's own ``jax.jit``, lowerings, update
rules on int64 counters) run in the JAX settings the engine gives its own work: 64-bit types
(``jax_backend.jax_settings``). The public paths set them themselves (tests/cstorch)."""

import pytest

from jax_backend.jax_settings import engine_scope


@pytest.fixture(autouse=True)
def _engine_settings():
    with engine_scope():
        yield
