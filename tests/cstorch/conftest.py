"""A fresh process state per test (the backend is a process singleton in cstorch)."""

import pytest

import cstorch


@pytest.fixture(autouse=True)
def _fresh_cstorch_state(tmp_path, monkeypatch):
    # Backends default their artifact directory to the working directory.
    monkeypatch.chdir(tmp_path)
    cstorch.config.reset()
    yield
    cstorch.config.reset()


@pytest.fixture
def cpu_backend(tmp_path):
    return cstorch.backend("CPU", artifact_dir=str(tmp_path))
