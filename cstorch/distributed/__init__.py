"""Cluster configuration, the multi-process job (``runtime``, ``launch``) and the
rank/streaming helpers of a run."""

from cstorch.distributed import cluster_resolver as cluster_resolver
from cstorch.distributed.cluster_config import ClusterConfig
from cstorch.distributed.ranks import (
    WORKER_CACHE_ROOT as WORKER_CACHE_ROOT,
    get_ordinal,
    get_rank,
    get_streaming_batch_size,
    get_streaming_rank,
    get_worker_state,
    get_world_size,
    hit_worker_cache_limit,
    is_master_ordinal,
    is_receiver,
    is_streamer,
    num_receivers,
    num_streamers,
    num_tasks,
    service_resolver,
)
from cstorch.distributed.runtime import DistributedConfig, DistributedError, join

__all__ = [
    "ClusterConfig",
    "get_ordinal",
    "get_rank",
    "get_streaming_batch_size",
    "get_streaming_rank",
    "get_world_size",
    "get_worker_state",
    "hit_worker_cache_limit",
    "is_master_ordinal",
    "is_receiver",
    "is_streamer",
    "num_receivers",
    "num_streamers",
    "num_tasks",
    "service_resolver",
    "DistributedConfig",
    "DistributedError",
    "join",
]
