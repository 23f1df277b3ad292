"""``ClusterConfig``: the Wafer-Scale Cluster a CSX run asks for, with validated fields.

Every assignment is validated (at construction and afterwards), and assigning
``ClusterConfig.DEFAULT`` to a field restores its default. On this implementation only
``num_csx`` (the size of the data-parallel mesh of the modeled wafer),
``max_wgt_servers`` (weight-streaming shards) and the keyword-only ``distributed`` (the
multi-process JAX job, an addition of this implementation) change how a run executes; the other fields are
kept and validated so that configurations written for the reference load unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import re
import time
from typing import List, Optional, Union

from cstorch.distributed.runtime import DistributedConfig
from jax_backend.errors import CstorchTypeError, CstorchValueError


class _DefaultSentinel:
    def __repr__(self):
        return "ClusterConfig.DEFAULT"


@dataclasses.dataclass
class MountDir:
    """A host directory mounted into the cluster's containers (at ``container_path``)."""

    path: str
    container_path: Optional[str] = None

    def __post_init__(self):
        if self.container_path is None:
            self.container_path = self.path


@dataclasses.dataclass
class NotificationTarget:
    """Where job notifications go (e-mail addresses, Slack/PagerDuty endpoints)."""

    mailto: List[str] = dataclasses.field(default_factory=list)
    slack: List[str] = dataclasses.field(default_factory=list)
    pagerduty: List[str] = dataclasses.field(default_factory=list)
    severity_threshold: Optional[int] = None


_LABEL_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
_ADDRESS = re.compile(r"^[^\s:]+:\d+$")
_PRIORITIES = ("p1", "p2", "p3")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_str(name, value):
    if value is not None and not isinstance(value, str):
        raise CstorchTypeError(f"ClusterConfig.{name} must be a string or None, got {value!r}.")
    return value


def _bool(name, value):
    if not isinstance(value, bool):
        raise CstorchTypeError(f"ClusterConfig.{name} must be a bool, got {value!r}.")
    return value


def _non_negative_int(name, value):
    if not _is_int(value) or value < 0:
        raise CstorchValueError(
            f"ClusterConfig.{name} must be a non-negative integer, got {value!r}."
        )
    return value


def _num_csx(name, value):
    return _FIELDS_DEFAULTS[name] if value is None else _non_negative_int(name, value)


def _mgmt_address(name, value):
    if value is not None and (not isinstance(value, str) or not _ADDRESS.match(value)):
        raise CstorchValueError(
            f"ClusterConfig.mgmt_address must look like '<name>:<port>', got {value!r}."
        )
    return value


def _job_labels(name, value):
    if not isinstance(value, (list, tuple)):
        raise CstorchValueError(
            f"ClusterConfig.job_labels must be a list of 'key=value' strings, got {value!r}."
        )
    for label in value:
        parts = label.split("=") if isinstance(label, str) else []
        if len(parts) != 2 or not all(_LABEL_PART.match(p) for p in parts):
            raise CstorchValueError(
                f"Invalid job label {label!r}: expected 'key=value' where key and value are "
                "at most 63 characters of letters, digits, '-', '_' and '.', starting and "
                "ending with a letter or digit."
            )
    return list(value)


def _job_priority(name, value):
    if value not in _PRIORITIES:
        raise CstorchValueError(
            f"ClusterConfig.job_priority must be one of {list(_PRIORITIES)}, got {value!r}."
        )
    return value


def _job_time_sec(name, value):
    if value is not None and (not _is_int(value) or value <= 0):
        raise CstorchValueError(
            f"ClusterConfig.job_time_sec must be a positive integer or None, got {value!r}."
        )
    return value


def _existing_path(name, path):
    if not os.path.exists(path):
        raise CstorchValueError(f"ClusterConfig.{name}: path {path!r} does not exist.")


def _mount_dirs(name, value):
    result = []
    for entry in value:
        mount = MountDir(entry) if isinstance(entry, str) else entry
        if not isinstance(mount, MountDir):
            raise CstorchValueError(
                f"ClusterConfig.mount_dirs entries must be paths or MountDir, got {entry!r}."
            )
        _existing_path(name, mount.path)
        result.append(mount)
    return result


def _python_paths(name, value):
    result = []
    for path in value:
        if not isinstance(path, str):
            raise CstorchValueError(
                f"ClusterConfig.python_paths entries must be paths, got {path!r}."
            )
        _existing_path(name, path)
        result.append(os.path.realpath(path))
    return result


def _notifications(name, value):
    result = []
    for entry in value:
        target = NotificationTarget(**entry) if isinstance(entry, dict) else entry
        if not isinstance(target, NotificationTarget):
            raise CstorchValueError(
                f"ClusterConfig.notifications entries must be NotificationTarget "
                f"or dict, got {entry!r}."
            )
        result.append(target)
    return result


def _distributed(name, value):
    if isinstance(value, dict):
        value = DistributedConfig(**value)
    if not isinstance(value, DistributedConfig):
        raise CstorchTypeError(
            f"ClusterConfig.distributed must be a "
            f"cstorch.distributed.DistributedConfig or a dict of its fields, got "
            f"{value!r}."
        )
    return value


_VALIDATORS = {
    "mgmt_address": _mgmt_address,
    "mgmt_namespace": _optional_str,
    "credentials_path": _optional_str,
    "num_csx": _num_csx,
    "max_wgt_servers": _non_negative_int,
    "max_act_per_csx": _non_negative_int,
    "num_workers_per_csx": _non_negative_int,
    "cbcore_image": _optional_str,
    "job_labels": _job_labels,
    "job_priority": _job_priority,
    "job_time_sec": _job_time_sec,
    "mount_dirs": _mount_dirs,
    "python_paths": _python_paths,
    "automount": _bool,
    "mount_all": _bool,
    "disable_mount_check": _bool,
    "disable_version_check": _bool,
    "workflow_id": _optional_str,
    "notifications": _notifications,
    "distributed": _distributed,
}


@dataclasses.dataclass
class ClusterConfig:
    """The cluster resources and job settings of a CSX run (see the module docstring)."""

    DEFAULT = _DefaultSentinel()

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
    mount_dirs: List[Union[str, MountDir]] = dataclasses.field(default_factory=list)
    python_paths: List[str] = dataclasses.field(default_factory=list)
    automount: bool = True
    mount_all: bool = True
    disable_mount_check: bool = True
    disable_version_check: bool = False
    workflow_id: Optional[str] = None
    notifications: List[Union[NotificationTarget, dict]] = dataclasses.field(default_factory=list)
    # Not in the reference: the multi-process JAX job of this run (see distributed.runtime).
    distributed: DistributedConfig = dataclasses.field(
        default_factory=DistributedConfig, kw_only=True
    )

    def __setattr__(self, name, value):
        validate = _VALIDATORS.get(name)
        if validate is not None:
            if value is ClusterConfig.DEFAULT:
                value = ClusterConfig.get_default(name)
            value = validate(name, value)
        super().__setattr__(name, value)

    def __hash__(self):
        # Hashable (the Model Zoo keys caches by it) by content, so equal configs hash alike.
        return hash(tuple(_frozen(getattr(self, f.name)) for f in dataclasses.fields(self)))

    @classmethod
    def get_default(cls, key: str):
        """The default value of field ``key`` (a fresh list for list fields)."""
        if key not in _FIELDS_DEFAULTS:
            raise KeyError(f"ClusterConfig has no field {key!r}.")
        default = _FIELDS_DEFAULTS[key]
        return list(default) if isinstance(default, list) else default

    @functools.cached_property
    def job_timer(self):
        """A timer for ``job_time_sec`` (None when no limit is set)."""
        return None if self.job_time_sec is None else _JobTimer(self.job_time_sec)


def _frozen(value):
    if dataclasses.is_dataclass(value):
        return tuple(_frozen(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


class _JobTimer:
    """Counts down ``job_time_sec`` from its creation."""

    def __init__(self, seconds: int):
        self.seconds = seconds
        self.start = time.monotonic()

    @property
    def remaining(self) -> float:
        return max(0.0, self.seconds - (time.monotonic() - self.start))


def _field_default(field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


_FIELDS_DEFAULTS = {f.name: _field_default(f) for f in dataclasses.fields(ClusterConfig)}

# Show the effective defaults (``job_labels=[]``) in the signature instead of ``<factory>``.
_signature = inspect.signature(ClusterConfig.__init__)
ClusterConfig.__init__.__signature__ = _signature.replace(
    parameters=[
        p.replace(default=_FIELDS_DEFAULTS[p.name]) if p.name in _FIELDS_DEFAULTS else p
        for p in _signature.parameters.values()
    ]
)
