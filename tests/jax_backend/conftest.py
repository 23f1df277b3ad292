"""The engine's internals (the interpreter under a test's own ``jax.jit``, lowerings, update
rules on int64 counters) run in the JAX settings the engine gives its own work: 64-bit types
(``jax_backend.jax_settings``). The public paths set them themselves (tests/cstorch).

Every engine test is ``core``: the compat and newest legs run them all on the other stacks."""

from pathlib import Path

import pytest

from jax_backend.jax_settings import engine_scope

_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m selects
def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.core)


@pytest.fixture(autouse=True)
def _engine_settings():
    with engine_scope():
        yield
