"""A fresh cstorch backend per test (the backend is a process singleton in cstorch)."""

import pytest

import cstorch
from cstorch.backend import precision


@pytest.fixture(autouse=True)
def _fresh_cstorch_state(tmp_path, monkeypatch):
    # Backends default their artifact directory to the working directory.
    monkeypatch.chdir(tmp_path)
    cstorch.backend._reset_for_tests()
    precision._AmpState.mixed_precision = False
    precision._AmpState.half_dtype_str = "float16"
    yield
    cstorch.backend._reset_for_tests()


@pytest.fixture
def cpu_backend(tmp_path):
    return cstorch.backend("CPU", artifact_dir=str(tmp_path))
