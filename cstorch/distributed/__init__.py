"""Cluster configuration, the multi-process job (``runtime``, ``launch``) and the
rank/streaming helpers of a run."""

from cstorch.distributed import cluster_resolver as cluster_resolver
from cstorch.distributed.cluster_config import ClusterConfig
from cstorch.distributed.ranks import get_ordinal
from cstorch.distributed.ranks import get_rank
from cstorch.distributed.ranks import get_world_size
from cstorch.distributed.ranks import get_streaming_batch_size
from cstorch.distributed.ranks import get_streaming_rank
from cstorch.distributed.ranks import get_worker_state
from cstorch.distributed.ranks import hit_worker_cache_limit
from cstorch.distributed.ranks import is_master_ordinal
from cstorch.distributed.ranks import is_receiver
from cstorch.distributed.ranks import is_streamer
from cstorch.distributed.ranks import num_receivers
from cstorch.distributed.ranks import num_streamers
from cstorch.distributed.ranks import num_tasks
from cstorch.distributed.ranks import service_resolver
from cstorch.distributed.ranks import WORKER_CACHE_ROOT as WORKER_CACHE_ROOT
from cstorch.distributed.runtime import DistributedConfig
from cstorch.distributed.runtime import DistributedError
from cstorch.distributed.runtime import join

__all__ = [
    "ClusterConfig", "get_ordinal", "get_rank", "get_streaming_batch_size", "get_streaming_rank",
    "get_world_size", "get_worker_state", "hit_worker_cache_limit", "is_master_ordinal",
    "is_receiver", "is_streamer", "num_receivers", "num_streamers", "num_tasks", "service_resolver",
    "DistributedConfig", "DistributedError", "join",
]
