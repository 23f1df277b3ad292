"""Regression gate for the OpInfo coverage harness, and the missing-lowering error.

``data/op_coverage_baseline.json`` records, for a fast subset of OpInfos, which samples passed
forward and backward when it was written (``python tools/op_coverage.py --ops ... --max-samples
2 --write-baseline tests/jax_backend/data/op_coverage_baseline.json``). The test reruns that
subset in a subprocess (so torch's global state stays clean) and fails if any recorded pass
regressed. Regenerate the file when coverage improves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from jax_backend import capture_step, registry
from jax_backend.errors import LoweringNotFoundError
from tests.paths import REPO as ROOT

BASELINE = os.path.join(os.path.dirname(__file__), "data", "op_coverage_baseline.json")


@pytest.mark.slow
@pytest.mark.heavy  # a minute or two of compilations: `make test` and the newest leg
@pytest.mark.newest  # a new torch brings new OpInfo samples; the compat leg runs test_ops
def test_no_regression_on_recorded_passing_samples(tmp_path):
    with open(BASELINE) as f:
        baseline = json.load(f)
    report_path = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tools", "op_coverage.py"),
            "--ops-file",
            BASELINE,
            "--json",
            str(report_path),
            "--no-cache",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with open(report_path) as f:
        report = json.load(f)
    # OpInfo variants newer than this torch are skipped (torch 2.9 lacks bmm.triton_optimized);
    # a few at most, or the gate would gate nothing.
    absent = set(report["meta"]["absent_opinfos"])
    assert len(absent) <= 3, absent
    regressions = []
    for name, expected in baseline["passing"].items():
        if name in absent:
            continue
        entry = report["ops"].get(name)
        samples = {s["index"]: s for s in (entry or {}).get("samples", [])}
        for phase in ("forward", "backward"):
            for index in expected[phase]:
                sample = samples.get(index)
                if sample is None or sample[phase] != "pass":
                    error = sample and sample.get(f"{phase}_error")
                    regressions.append(
                        f"{name}[{index}] {phase}: {sample and sample[phase]} {error or ''}"[:300]
                    )
    assert not regressions, "coverage regressed:\n" + "\n".join(regressions)


def test_baseline_is_not_trivial():
    with open(BASELINE) as f:
        baseline = json.load(f)
    assert len(baseline["ops"]) >= 30
    passing = baseline["passing"]
    assert sum(len(v["forward"]) for v in passing.values()) >= 50
    assert sum(len(v["backward"]) for v in passing.values()) >= 30


def _step_with_erfinv(x):
    y = x * 2
    return torch.special.erfinv(y)  # the line the error must name


def test_missing_lowering_names_op_and_user_line(monkeypatch):
    op = torch.ops.aten.erfinv.default
    assert registry.has_lowering(op)
    monkeypatch.delitem(registry._LOWERINGS, op)
    with pytest.raises(NotImplementedError) as info:
        capture_step(_step_with_erfinv, [], [torch.rand(4)])
    err = info.value
    assert isinstance(err, LoweringNotFoundError)
    message = str(err)
    assert "aten.erfinv.default" in message
    assert "test_op_coverage.py" in message
    assert "torch.special.erfinv(y)" in message


@pytest.mark.slow
def test_harness_classifies_a_missing_lowering(monkeypatch):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import op_coverage
    finally:
        sys.path.pop(0)
    monkeypatch.delitem(registry._LOWERINGS, torch.ops.aten.erfinv.default)
    report = op_coverage.run(["erfinv"], max_samples=1)
    sample = report["ops"]["erfinv"]["samples"][0]
    assert sample["forward"] == "no_lowering"
    assert "aten.erfinv.default" in sample["forward_error"]
    assert report["failures"][0]["category"] == "no_lowering"


def test_a_float32_mismatch_is_judged_against_float64_only_where_torch_is_no_closer():
    """torch 2.15's fused CPU attention backward (OpInfo sdpa sample 0, with enable_gqa) gives
    +-5e-6 where the exact gradient is 0; the engine gives -+6e-6: 1.2e-5 apart, past the
    1e-5 tolerance, though both are within it of float64. Such a value passes, noted; a value
    off float64, or farther from it than eager float32, still fails."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import op_coverage
    finally:
        sys.path.pop(0)
    exact = torch.tensor([0.0, 24.4, -3.0], dtype=torch.float64)
    eager = torch.tensor([5.8e-6, 24.4 + 2.5e-5, -3.0])
    engine = torch.tensor([-6.5e-6, 24.4 + 6e-6, -3.0])
    assert op_coverage._compare(engine, eager, 1e-5, 1e-5) is not None  # the mismatch
    note = op_coverage._judge_by_float64(engine, eager, exact, 1e-5, 1e-5)
    assert note is not None and "within tolerance of float64" in note
    wrong = torch.tensor([-2e-5, 24.4, -3.0])  # 2e-5 off the exact 0: past the tolerance
    assert op_coverage._judge_by_float64(wrong, eager, exact, 1e-5, 1e-5) is None
    farther = torch.tensor([-9e-6, 24.4 + 3e-5, -3.0])  # within tolerance, farther than torch
    assert op_coverage._judge_by_float64(farther, eager, exact, 1e-5, 1e-5) is None
    assert op_coverage._judge_by_float64(engine, eager, exact.float(), 1e-5, 1e-5) is None
