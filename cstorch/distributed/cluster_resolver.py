"""The tasks of a cluster run: ``TaskSpec`` (one process), ``ClusterSpec`` (all of them) and
the ``ClusterResolver`` that answers questions about them.

A single-host run is one task (rank 0, master and worker, see ``service_resolver``). The Model
Zoo also builds these itself for its data pipelines.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import List, Optional

from jax_backend.errors import CstorchValueError


class TaskRole(enum.Enum):
    MASTER = "master"
    WORKER = "worker"


@dataclasses.dataclass
class TaskSpec:
    """One task: its global rank, its rank on its node, its system and node, its roles."""

    rank: int
    local_rank: int
    wse_id: int
    node_name: str
    roles: Optional[List[TaskRole]] = None

    def __post_init__(self):
        for name in ("rank", "local_rank", "wse_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise CstorchValueError(
                    f"TaskSpec.{name} must be a non-negative int, got {value!r}."
                )
        if not self.node_name:
            raise CstorchValueError("TaskSpec.node_name must not be empty.")


@dataclasses.dataclass
class ClusterSpec:
    """All tasks (ranked 0..n-1), the current task's rank, the systems and workers per system."""

    tasks: List[TaskSpec]
    rank: int
    num_csx: int
    num_workers_per_csx: int

    def __post_init__(self):
        if not self.tasks:
            raise CstorchValueError("A ClusterSpec needs at least one task.")
        if not 0 <= self.rank < len(self.tasks):
            raise CstorchValueError(
                f"ClusterSpec.rank {self.rank} is not among the {len(self.tasks)} tasks."
            )
        ranks = [t.rank for t in self.tasks]
        if ranks != list(range(len(self.tasks))):
            raise CstorchValueError(
                f"Task ranks must be 0..{len(self.tasks) - 1} in order, got {ranks}."
            )
        if self.num_workers_per_csx < 0:
            raise CstorchValueError("ClusterSpec.num_workers_per_csx must be non-negative.")

    def num_tasks(self) -> int:
        return len(self.tasks)

    def task(self, rank: Optional[int] = None) -> TaskSpec:
        """The task of ``rank`` (the current task when None)."""
        rank = self.rank if rank is None else rank
        if not 0 <= rank < len(self.tasks):
            raise CstorchValueError(
                f"Invalid task rank {rank}: ranks are 0..{len(self.tasks) - 1}."
            )
        return self.tasks[rank]

    def filter_tasks_by_role(self, role: TaskRole) -> List[TaskSpec]:
        return [t for t in self.tasks if role in (t.roles or [])]


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
        return role in (self._spec.task(rank).roles or [])
