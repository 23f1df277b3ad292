"""A fresh cstorch backend (a process singleton) and default precision state per test."""

import pytest

import cstorch
from cstorch.backend import precision


@pytest.fixture(autouse=True)
def _fresh_cstorch_state(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cstorch.backend._reset_for_tests()
    precision._AmpState.mixed_precision = False
    precision._AmpState.half_dtype_str = "float16"
    yield
    cstorch.backend._reset_for_tests()
