"""Who does what in a run: the tasks of the cluster and their roles.

On a Wafer-Scale Cluster the user node compiles and receives outputs while worker nodes
stream input batches. Here every process of the (JAX) job is a task that streams its slice of
each global batch; task 0 is also the master and the only receiver. A single-process run is
one task that does everything.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import List, Optional


class TaskRole(enum.Enum):
    """Roles a task can have."""

    MASTER = "master"
    WORKER = "worker"


@dataclasses.dataclass
class TaskSpec:
    """One task: its global rank, rank on its node, the wafer it streams to, and roles."""

    rank: int
    local_rank: int
    wse_id: int
    node_name: str
    roles: List[TaskRole] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ClusterSpec:
    """All tasks of the cluster and the rank of this process's task."""

    tasks: List[TaskSpec]
    rank: int
    num_csx: int
    num_workers_per_csx: int

    def num_tasks(self) -> int:
        return len(self.tasks)

    def task(self, rank: Optional[int] = None) -> TaskSpec:
        """The task of ``rank`` (this process's task if None)."""
        rank = self.rank if rank is None else rank
        if not 0 <= rank < self.num_tasks():
            raise ValueError(f"Invalid task rank {rank}. Available ranks are: "
                             f"{list(range(self.num_tasks()))}.")
        return self.tasks[rank]

    def filter_tasks_by_role(self, role: TaskRole) -> List[TaskSpec]:
        return [task for task in self.tasks if role in task.roles]


class ClusterResolver:
    """Answers questions about the cluster from its ``ClusterSpec``."""

    def __init__(self, spec: ClusterSpec):
        self._spec = spec

    def cluster_spec(self) -> ClusterSpec:
        return self._spec

    @property
    def num_tasks(self) -> int:
        return self._spec.num_tasks()

    @property
    def rank(self) -> int:
        return self._spec.rank

    @property
    def task(self) -> TaskSpec:
        return self._spec.task()

    def assumes_role(self, role: TaskRole, rank: Optional[int] = None) -> bool:
        return role in self._spec.task(rank).roles


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

    tasks = [TaskSpec(rank=r, local_rank=r, wse_id=0, node_name="localhost",
                      roles=[TaskRole.MASTER, TaskRole.WORKER] if r == 0 else [TaskRole.WORKER])
             for r in range(process_count())]
    return ServiceResolver(ClusterResolver(ClusterSpec(tasks, rank=process_index(), num_csx=1,
                                                       num_workers_per_csx=1)))
