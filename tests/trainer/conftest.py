"""A fresh process state per test (the backend is a process singleton in cstorch)."""

import pytest

import cstorch


@pytest.fixture(autouse=True)
def _fresh_cstorch_state(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cstorch.config.reset()
    yield
    cstorch.config.reset()
