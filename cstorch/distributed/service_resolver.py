"""Who does what in a run: the tasks of the cluster and their roles.

On a Wafer-Scale Cluster the user node compiles and receives outputs while worker nodes
stream input batches. Here every process of the (JAX) job is a task that streams its slice of
each global batch; task 0 is also the master and the only receiver. A single-process run is
one task that does everything.
"""

from __future__ import annotations

from typing import List

from cstorch.distributed.cluster_resolver import (  # re-exported names
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
    """The tasks of this job: one per process (see ``cstorch.distributed.runtime``). Every
    process streams its slice of the input; process 0 is also the master and the receiver
    (step and checkpoint closures run there). A single-process run is task 0 alone."""
    from cstorch.distributed.runtime import process_count, process_index

    tasks = [
        TaskSpec(
            rank=r,
            local_rank=r,
            wse_id=0,
            node_name="localhost",
            roles=[TaskRole.MASTER, TaskRole.WORKER] if r == 0 else [TaskRole.WORKER],
        )
        for r in range(process_count())
    ]
    return ServiceResolver(
        ClusterResolver(ClusterSpec(tasks, rank=process_index(), num_csx=1, num_workers_per_csx=1))
    )
