"""The modeled wafer on several devices: num_csx data parallelism and weight-server sharding
give the numbers of the single-device run (run in a subprocess so XLA can model
four CPU devices)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.core

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_data_parallel_and_weight_servers_match_one_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", PYTHONPATH=ROOT)
    configs = [[1, 0], [2, 0], [4, 0], [4, 2]]
    out = subprocess.run(
        [sys.executable, "-m", "tests.cstorch.multidevice_run", json.dumps(configs)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    line = next((s for s in out.stdout.splitlines() if s.startswith("RESULT ")), None)
    assert line is not None, out.stderr[-3000:]
    results = json.loads(line[7:])
    single = results["1:0"]
    assert single["devices"] == 1
    for key in ("2:0", "4:0", "4:2"):
        run = results[key]
        assert run["devices"] == int(key.split(":")[0]), key
        assert run["losses"] == pytest.approx(single["losses"], rel=1e-5), key
        assert run["final"] == pytest.approx(single["final"], rel=1e-5), key
    assert results["4:0"]["spec"] == []  # replicated parameters
    assert results["4:2"]["spec"] == ["csx"]  # streamed (sharded) weights


def test_more_replicas_than_devices_is_a_clear_error():
    import cerebras.pytorch as cstorch
    from cstorch.distributed import ClusterConfig

    with pytest.raises(RuntimeError, match="xla_force_host_platform_device_count"):
        cstorch.backend("CSX", cluster_config=ClusterConfig(num_csx=64))
