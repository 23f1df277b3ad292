"""Fresh process-wide state per test: the cstorch backend, mixed precision, and the 1.8
API's once-per-process ``configure``."""

import pytest

import cstorch
from cstorch.backend import precision


@pytest.fixture(autouse=True)
def _fresh_state(tmp_path, monkeypatch):
    from cerebras_pytorch.experimental import _configure, summaries

    monkeypatch.chdir(tmp_path)
    cstorch.backend._reset_for_tests()
    precision._AmpState.mixed_precision = False
    precision._AmpState.half_dtype_str = "float16"
    _configure._settings = None
    summaries._pending.clear()
    cstorch.metrics.Metric.registry.clear()  # metrics of earlier tests' models
    yield
    cstorch.backend._reset_for_tests()
    _configure._settings = None
