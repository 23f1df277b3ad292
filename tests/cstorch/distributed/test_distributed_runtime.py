"""The multi-process job's settings, ranks, launcher environment and HLO communication
counter, in process (the jobs themselves run in test_distributed_jobs.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import cerebras.pytorch as cstorch
from cstorch.distributed import ClusterConfig, DistributedConfig, DistributedError, launch, runtime
from jax_backend import mesh

pytestmark = pytest.mark.core


@pytest.fixture
def job_env(monkeypatch):
    """Pretend to be process 1 of 2 (the ranks read the job from the environment)."""
    for name, value in (
        (runtime.ENV_COORDINATOR, "127.0.0.1:1234"),
        (runtime.ENV_NUM_PROCESSES, "2"),
        (runtime.ENV_PROCESS_ID, "1"),
    ):
        monkeypatch.setenv(name, value)


def test_config_from_environment_and_precedence(monkeypatch):
    assert not DistributedConfig.from_env({}).is_multi_process
    env = {
        runtime.ENV_COORDINATOR: "10.0.0.1:9000",
        runtime.ENV_NUM_PROCESSES: "4",
        runtime.ENV_PROCESS_ID: "3",
        runtime.ENV_HEARTBEAT_TIMEOUT: "7",
    }
    config = DistributedConfig.from_env(env)
    assert (
        config.coordinator_address,
        config.num_processes,
        config.process_id,
        config.heartbeat_timeout,
        config.initialization_timeout,
    ) == ("10.0.0.1:9000", 4, 3, 7, 60)
    explicit = DistributedConfig(num_processes=2, process_id=0).merged_with(config)
    assert (explicit.num_processes, explicit.process_id, explicit.coordinator_address) == (
        2,
        0,
        "10.0.0.1:9000",
    )
    with pytest.raises(ValueError, match="CSTORCH|num_processes"):
        DistributedConfig.from_env({runtime.ENV_NUM_PROCESSES: "two"})


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(coordinator_address="no-port"),
        dict(coordinator_address=1234),
        dict(num_processes=0),
        dict(process_id=-1),
        dict(num_processes=True),
        dict(heartbeat_timeout=0),
        dict(initialization_timeout="soon"),
    ],
)
def test_config_rejects_invalid_values(kwargs):
    with pytest.raises(ValueError):
        DistributedConfig(**kwargs)


def test_cluster_config_carries_the_job():
    config = ClusterConfig(
        num_csx=4,
        distributed={"num_processes": 2, "process_id": 1, "coordinator_address": "host:1"},
    )
    assert config.distributed == DistributedConfig("host:1", 2, 1)
    with pytest.raises(TypeError, match="DistributedConfig"):
        config.distributed = 3
    config.distributed = ClusterConfig.DEFAULT
    assert not config.distributed.is_multi_process
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.distributed.num_processes = 2


def test_incomplete_job_is_a_clear_error():
    with pytest.raises(DistributedError, match="coordinator address"):
        runtime.join(DistributedConfig(num_processes=2, process_id=0))
    with pytest.raises(DistributedError, match="out of range"):
        runtime.join(DistributedConfig("127.0.0.1:1", num_processes=2, process_id=2))


def test_joining_after_jax_started_is_refused(job_env):
    import jax

    jax.devices()  # this test process computes with JAX already
    with pytest.raises(DistributedError, match="before JAX starts"):
        runtime.join()
    assert runtime.joined() is None


def test_ranks_follow_the_job(job_env):
    d = cstorch.distributed
    assert (d.num_tasks(), d.num_streamers(), d.num_receivers()) == (2, 2, 1)
    assert d.get_ordinal() == 1 and d.get_streaming_rank() == 1
    assert not d.is_master_ordinal() and d.is_streamer() and not d.is_receiver()
    assert d.get_streaming_batch_size(16) == 8
    assert d.get_streaming_batch_size(16, global_rank=0) == 8
    with pytest.raises(ValueError, match="evenly"):
        d.get_streaming_batch_size(15)
    with pytest.raises(ValueError):
        d.get_streaming_batch_size(16, global_rank=2)


def test_launcher_environment():
    env = launch.process_environment(
        {"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=8"},
        1,
        2,
        "127.0.0.1:5",
        devices_per_process=2,
        heartbeat_timeout=9,
    )
    assert env[runtime.ENV_PROCESS_ID] == "1" and env[runtime.ENV_NUM_PROCESSES] == "2"
    assert env[runtime.ENV_COORDINATOR] == "127.0.0.1:5"
    assert env[runtime.ENV_HEARTBEAT_TIMEOUT] == "9"
    assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=2"
    # torch's idle OpenMP threads sleep in launched processes, unless the caller says otherwise
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert (
        launch.process_environment({"OMP_WAIT_POLICY": "ACTIVE"}, 0, 2, "127.0.0.1:5")[
            "OMP_WAIT_POLICY"
        ]
        == "ACTIVE"
    )
    assert DistributedConfig.from_env(env) == DistributedConfig(
        "127.0.0.1:5", 2, 1, heartbeat_timeout=9
    )
    assert 0 < launch.free_port() < 65536


def test_launcher_rejects_a_missing_script(tmp_path):
    with pytest.raises(SystemExit, match="No such script"):
        launch.main(["--num_processes", "2", str(tmp_path / "missing.py")])


HLO = """
ENTRY %main (p: f32[64,16]) -> f32[] {
  %all-gather.1 = f32[64,16]{1,0} all-gather(%p), channel_id=1, dimensions={0}
  %all-reduce.2 = (f32[16,32]{1,0}, f32[32]{0}, /*index=2*/bf16[8]{0}) all-reduce(%a, %b, %c), to_apply=%add
  %reduce-scatter = f32[4,16]{1,0} reduce-scatter(%g), dimensions={0}
  %all-reduce-start = (f32[10]{0}, f32[10]{0}) all-reduce-start(%x), to_apply=%add
  %all-reduce-done = f32[10]{0} all-reduce-done(%all-reduce-start)
  %add.3 = f32[] add(%s, %t)
}
"""


def test_communication_counts_collectives_of_compiled_hlo():
    assert mesh.communication(HLO) == {
        "all-gather": (1, 64 * 16 * 4),
        "all-reduce": (2, (16 * 32 + 32) * 4 + 8 * 2 + 10 * 4),
        "reduce-scatter": (1, 4 * 16 * 4),
    }


def test_layout_refuses_more_systems_than_devices():
    with pytest.raises(RuntimeError, match="xla_force_host_platform_device_count=8"):
        mesh.Layout.build(mesh.devices(), num_csx=4, devices_per_csx=2)


def test_host_value_of_local_arrays():
    import jax.numpy as jnp

    np.testing.assert_array_equal(mesh.host_value(jnp.arange(3)), [0, 1, 2])
    np.testing.assert_array_equal(mesh.host_value(np.ones(2)), [1.0, 1.0])


def test_torchrun_environment_describes_the_job():
    env = {
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "8",
        "RANK": "5",
        "LOCAL_RANK": "1",
    }
    assert DistributedConfig.from_torchrun_env(env) == DistributedConfig("node0:29500", 8, 5)
    with pytest.raises(DistributedError, match="WORLD_SIZE"):
        DistributedConfig.from_torchrun_env({"MASTER_ADDR": "a", "MASTER_PORT": "1"})
