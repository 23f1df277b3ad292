"""benchmarks/bench_gpu.py: its smoke run (tiny sizes on CPU, each engine in its own
process) completes and writes the JSON that tools read; its FLOP and peak tables."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.paths import REPO as ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_gpu


@pytest.mark.slow
def test_smoke_run_writes_every_measurement(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "CSTORCH_ENGINE"}
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "bench_gpu.py"),
            "--smoke",
            "--steps",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    results = report["results"]
    assert {(r["engine"], r["precision"]) for r in results} == {
        ("eager", "fp32"),
        ("cstorch", "fp32"),
        ("eager", "bf16"),
        ("cstorch", "bf16"),
    }
    for r in results:
        assert "error" not in r, r
        assert r["ms_per_step"] > 0 and r["tokens_per_s"] > 0 and r["first_step_s"] > 0
        assert math.isfinite(r["loss"]) and r["device"] == "cpu" and r["mfu"] is None
    eager = {r["precision"]: r["loss"] for r in results if r["engine"] == "eager"}
    for r in (r for r in results if r["engine"] == "cstorch"):
        assert r["traces"] == 1  # one capture, every later step a call of the program
        assert r["run_end_sync_s"] >= 0 and r["state_sync_s"] >= 0
        assert set(r["first_step_split_s"]) == {"capture", "lowering", "mlir", "xla_compile"}
        # The same model, data and number of AdamW steps as eager torch (whose AdamW differs
        # from the Cerebras one in where eps enters, hence not closer).
        assert r["loss"] == pytest.approx(eager[r["precision"]], rel=2e-3)


def test_peak_table_and_model_flops():
    assert bench_gpu.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert bench_gpu.peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 66.9
    assert bench_gpu.peak_tflops("NVIDIA H200", "bf16") == 989.4
    assert bench_gpu.peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert bench_gpu.peak_tflops("Some New GPU", "bf16") is None
    spec = bench_gpu.WORKLOADS["gpt2s"]
    model, *_ = bench_gpu.build(dict(spec, layers=1))
    parameters = sum(p.numel() for p in model.parameters())
    embedding = model[0].weight.numel()
    # One block (12 d^2 + 13 d) + final norm + head, times 6, plus attention, per token.
    d, vocab = spec["d"], spec["vocab"]
    expected = 6 * (12 * d * d + 13 * d + 2 * d + d * vocab + vocab) + 12 * d * spec["seq"]
    assert bench_gpu.model_flops_per_step(dict(spec, layers=1), parameters, embedding) == (
        expected * spec["batch"] * spec["seq"]
    )
