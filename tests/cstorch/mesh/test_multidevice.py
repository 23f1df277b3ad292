"""The modeled wafer on several devices: num_csx data parallelism and weight-server sharding
give the numbers of the single-device run (run in a subprocess so XLA can model
four CPU devices)."""

import json
import os
import subprocess
import sys

import pytest

from tests.paths import REPO

pytestmark = pytest.mark.core


@pytest.mark.slow
def test_data_parallel_and_weight_servers_match_one_device():
    configs = [[1, 0], [2, 0], [4, 0], [4, 2]]
    results = _run_on_four_devices("tests.cstorch.mesh.multidevice_run", json.dumps(configs))
    single = results["1:0"]
    assert single["devices"] == 1
    for key in ("2:0", "4:0", "4:2"):
        run = results[key]
        assert run["devices"] == int(key.split(":")[0]), key
        assert run["losses"] == pytest.approx(single["losses"], rel=1e-5), key
        assert run["final"] == pytest.approx(single["final"], rel=1e-5), key
    assert results["4:0"]["spec"] == []  # replicated parameters
    assert results["4:2"]["spec"] == ["csx"]  # streamed (sharded) weights


def _run_on_four_devices(module: str, *args: str) -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", PYTHONPATH=REPO)
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    line = next((s for s in out.stdout.splitlines() if s.startswith("RESULT ")), None)
    assert line is not None, out.stderr[-3000:]
    return json.loads(line[7:])


@pytest.mark.slow
def test_rigl_sparsity_on_two_replicas_with_weight_servers_matches_one_device():
    results = _run_on_four_devices("tests.cstorch.mesh.sparse_multidevice_run")
    single, wafer = results["1:0"], results["2:2"]
    assert wafer["losses"] == pytest.approx(single["losses"], rel=1e-5)
    assert wafer["mask"] == single["mask"]  # RigL's drop and regrow picked the same weights
    assert 0 < sum(single["mask"]) < len(single["mask"])  # a real mask: some weights pruned
    assert wafer["trace_count"] == single["trace_count"] == 1


def test_more_replicas_than_devices_is_a_clear_error():
    import cerebras.pytorch as cstorch
    from cstorch.distributed import ClusterConfig

    with pytest.raises(RuntimeError, match="xla_force_host_platform_device_count"):
        cstorch.backend("CSX", cluster_config=ClusterConfig(num_csx=64))
