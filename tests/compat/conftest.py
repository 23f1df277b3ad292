"""A fresh process state per test: the cstorch backend, mixed precision, metrics and the 1.8
API's once-per-process ``configure`` (``cstorch.config.reset``)."""

import pytest

import cstorch


@pytest.fixture(autouse=True)
def _fresh_state(tmp_path, monkeypatch):
    import cerebras_pytorch.experimental  # noqa: F401  (registers its reset hooks)

    monkeypatch.chdir(tmp_path)
    cstorch.config.reset()
    yield
    cstorch.config.reset()
