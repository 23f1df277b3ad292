"""Who does what in a run: the tasks of the cluster and their roles.

On a Wafer-Scale Cluster the user node compiles and receives outputs while worker nodes
stream input batches. This implementation runs on a single host: one task (rank 0) that is
the master, the only streamer (its dataloader feeds the steps) and the only receiver.
"""

from __future__ import annotations

from typing import List

from cstorch.distributed.cluster_resolver import (  # noqa: F401 - re-exported names
    ClusterResolver,
    ClusterSpec,
    TaskRole,
    TaskSpec,
)


class ServiceResolver:
    """The streamers (workers) and receivers (master) of the cluster."""

    def __init__(self, resolver: ClusterResolver):
        self._resolver = resolver

    @property
    def cluster_resolver(self) -> ClusterResolver:
        return self._resolver

    @property
    def cluster_spec(self) -> ClusterSpec:
        return self._resolver.cluster_spec()

    def streamer_ordinals(self) -> List[int]:
        return [t.rank for t in self.cluster_spec.filter_tasks_by_role(TaskRole.WORKER)]

    def receiver_ordinals(self) -> List[int]:
        return [t.rank for t in self.cluster_spec.filter_tasks_by_role(TaskRole.MASTER)]


def local_service_resolver() -> ServiceResolver:
    """The single-host cluster: task 0 is master, streamer and receiver."""
    task = TaskSpec(rank=0, local_rank=0, wse_id=0, node_name="localhost",
                    roles=[TaskRole.MASTER, TaskRole.WORKER])
    return ServiceResolver(ClusterResolver(ClusterSpec([task], rank=0, num_csx=1,
                                                       num_workers_per_csx=1)))
