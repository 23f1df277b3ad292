"""``ClusterConfig``: how many wafers and weight servers a CSX run uses (validated fields)."""

from __future__ import annotations

import dataclasses
from typing import List, Optional


def _check_non_negative_int(name, value, allow_none=False):
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"ClusterConfig.{name} must be a non-negative integer, got {value!r}.")


@dataclasses.dataclass
class ClusterConfig:
    mgmt_address: Optional[str] = None
    mgmt_namespace: Optional[str] = None
    credentials_path: Optional[str] = None
    num_csx: int = 1
    max_wgt_servers: int = 0
    max_act_per_csx: int = 0
    num_workers_per_csx: int = 1
    cbcore_image: Optional[str] = None
    job_labels: List[str] = dataclasses.field(default_factory=list)
    job_priority: str = "p2"
    job_time_sec: Optional[int] = None
    mount_dirs: List[str] = dataclasses.field(default_factory=list)
    python_paths: List[str] = dataclasses.field(default_factory=list)
    automount: bool = True
    mount_all: bool = True
    disable_mount_check: bool = True
    disable_version_check: bool = False
    workflow_id: Optional[str] = None
    notifications: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.num_csx is None:
            self.num_csx = 1
        for name in ("num_csx", "max_wgt_servers", "max_act_per_csx", "num_workers_per_csx"):
            _check_non_negative_int(name, getattr(self, name))
