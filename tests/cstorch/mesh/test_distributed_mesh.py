"""cstorch.distributed (ClusterConfig, single-host ranks) and cstorch.mesh."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from cerebras.pytorch.distributed import ClusterConfig

import cerebras.pytorch as cstorch
from cerebras.pytorch import mesh

pytestmark = pytest.mark.core


# ------------------------------------------------------------------------ ClusterConfig
def test_cluster_config_defaults_and_signature():
    config = ClusterConfig()
    assert config.num_csx == 1 and config.max_wgt_servers == 0 and config.job_priority == "p2"
    assert config.job_labels == [] and config.job_labels is not ClusterConfig().job_labels
    assert inspect.signature(ClusterConfig).parameters["job_labels"].default == []
    assert ClusterConfig(num_csx=None).num_csx == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_csx=-1),
        dict(num_csx=1.5),
        dict(max_wgt_servers=-2),
        dict(max_act_per_csx=True),
        dict(num_workers_per_csx="2"),
        dict(mgmt_address="no-port"),
        dict(job_labels=["a"]),
        dict(job_labels=["a=b=c"]),
        dict(job_labels=["-bad=x"]),
        dict(job_priority="p4"),
        dict(job_time_sec=0),
        dict(mount_dirs=["/does/not/exist"]),
        dict(python_paths=["/does/not/exist"]),
        dict(notifications=[3]),
    ],
)
def test_cluster_config_rejects_invalid_values(kwargs):
    with pytest.raises(ValueError):
        ClusterConfig(**kwargs)


def test_cluster_config_type_errors_and_default_reset(tmp_path):
    with pytest.raises(TypeError):
        ClusterConfig(automount="yes")
    config = ClusterConfig(
        num_csx=4,
        job_labels=["team=ml"],
        mgmt_address="host:9000",
        python_paths=[str(tmp_path)],
        mount_dirs=[str(tmp_path)],
        notifications=[{"mailto": ["a@b.c"]}],
        job_time_sec=60,
    )
    assert config.mount_dirs[0].path == str(tmp_path)
    assert config.notifications[0].mailto == ["a@b.c"]
    assert config.job_timer.remaining <= 60
    config.num_csx = ClusterConfig.DEFAULT
    config.job_labels = ClusterConfig.DEFAULT
    assert config.num_csx == 1 and config.job_labels == []
    with pytest.raises(ValueError):
        config.num_csx = -3
    assert ClusterConfig.get_default("max_wgt_servers") == 0


def test_csx_backend_uses_and_checks_the_cluster_config(tmp_path):
    with pytest.raises(ValueError, match="num_csx"):
        cstorch.backend("CSX", artifact_dir=str(tmp_path), cluster_config=ClusterConfig(num_csx=0))


# ------------------------------------------------------------------------ ranks
def test_single_host_rank_helpers():
    d = cstorch.distributed
    assert (d.num_tasks(), d.num_streamers(), d.num_receivers()) == (1, 1, 1)
    assert d.get_ordinal() == 0 and d.get_streaming_rank() == 0
    assert d.is_master_ordinal() and d.is_streamer() and d.is_receiver()
    assert d.service_resolver().cluster_spec.task().wse_id == 0
    assert d.get_streaming_batch_size(32) == 32
    with pytest.raises(TypeError):
        d.get_streaming_batch_size(3.0)
    with pytest.raises(ValueError):
        d.get_streaming_batch_size(0)
    with pytest.raises(ValueError):
        d.get_streaming_batch_size(8, global_rank=5)


def _disk(total_blocks, free_blocks, block=4096):
    """A stand-in for ``os.statvfs``: the test must not depend on this machine's disk."""
    import types

    return lambda path: types.SimpleNamespace(
        f_frsize=block, f_blocks=total_blocks, f_bavail=free_blocks
    )


def test_hit_worker_cache_limit(tmp_path, monkeypatch):
    from cstorch.distributed import ranks

    cache = tmp_path / "cache"
    (cache / "old").mkdir(parents=True)
    (cache / "old" / "y.bin").write_bytes(b"0" * 1024)  # replaced by the copy
    source = tmp_path / "data"
    source.mkdir()
    (source / "x.bin").write_bytes(b"0" * 4096)
    monkeypatch.setattr(ranks, "WORKER_CACHE_ROOT", str(cache))
    assert ranks.SSD_LIMIT == 0.8
    # 1000 blocks of 4 KiB, 700 used: 800 - 700 blocks + the 1 KiB replaced are available.
    monkeypatch.setattr(ranks.os, "statvfs", _disk(1000, 300))
    hit, size, available = cstorch.distributed.hit_worker_cache_limit(
        str(source), str(cache / "old")
    )
    assert (hit, size, available) == (False, "4.00 KB", "401.00 KB")
    # 800 blocks used: the copy (4 KiB in, 1 KiB out) would pass the 80 % limit.
    monkeypatch.setattr(ranks.os, "statvfs", _disk(1000, 200))
    hit, _, available = cstorch.distributed.hit_worker_cache_limit(str(source), str(cache / "old"))
    assert (hit, available) == (True, "1.00 KB")
    with pytest.raises(ValueError):
        cstorch.distributed.hit_worker_cache_limit(str(source), str(tmp_path / "elsewhere"))


# ------------------------------------------------------------------------ mesh
def _mesh():
    return mesh.Mesh(0, np.array([mesh.Box(0, 0, 0, 0), mesh.Box(1, 1, 0, 0)]))


def test_sharding_spec():
    spec = mesh.sharding_spec([mesh.shard(0), mesh.replicate()], _mesh(), device="WSE")
    assert spec == mesh.ShardingSpec(0, [0, -1], None, None, ["WSE"])
    assert mesh.sharding_spec([mesh.Replicate()], _mesh()).devices is None
    assert mesh.Shard(1).is_shard() and mesh.Replicate().is_replicate()
    with pytest.raises(ValueError):
        mesh.sharding_spec([mesh.Replicate()], _mesh(), device="TPU")
    with pytest.raises(TypeError):
        mesh.sharding_spec([0], _mesh())
    with pytest.raises(TypeError):
        mesh.sharding_spec([mesh.Shard(0)], _mesh(), device="GlobalHost")


def test_collectives_validate_then_return_their_input():
    t = torch.ones(2, 3)
    spec = mesh.sharding_spec([mesh.Shard(0), mesh.Replicate()], _mesh())
    assert mesh.distribute_tensor(t, spec, ["N"]) is t
    with pytest.raises(ValueError):
        mesh.distribute_tensor(torch.ones(2), spec, ["N"])
    with pytest.raises(ValueError):
        mesh.distribute_tensor(t, spec, [])
    partial = mesh.ShardingSpec(0, [0, -1], [0, -1], "SUM", None)
    with pytest.raises(ValueError, match="cannot be the same"):
        mesh.distribute_tensor(t, partial, ["N"])
    assert mesh.all_gather(t, [0]) is t
    for axes in ([-1], [2]):
        with pytest.raises(ValueError):
            mesh.all_gather(t, axes)
    assert mesh.all_slice(t, [mesh.Shard(0)], ["N"]) is t
    for args in (([mesh.Shard(0)] * 3, ["a"] * 3), ([1], []), ([mesh.Shard(0)], [])):
        with pytest.raises(ValueError):
            mesh.all_slice(t, *args)
    assert mesh.d2d_transfer(t, "LocalHost") is t
    with pytest.raises(TypeError):
        mesh.d2d_transfer(t, "Disk")
    assert mesh.m2m_transfer(t, _mesh(), _mesh()) is t
