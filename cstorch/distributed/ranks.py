"""Rank and streaming helpers of ``cstorch.distributed``: one task per process of the job
(see ``service_resolver``), so samplers shard their data by ``get_streaming_rank()`` out of
``num_streamers()``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from cstorch.distributed.service_resolver import TaskRole, local_service_resolver
from cstorch.distributed.worker_state import WorkerState
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError, CstorchValueError

WORKER_CACHE_ROOT = "/n0/cache"
SSD_LIMIT = 0.8  # fraction of the worker cache that may be filled


def get_worker_state():
    """The ``DataLoaderCheckpoint`` of this worker; call it once inside a restartable
    dataloader's ``state_dict`` (a second call raises RuntimeError)."""
    return WorkerState.get_worker_state()


def get_rank() -> int:
    """This process's rank among the ``torch.distributed`` processes (0 when torch.distributed
    is not initialized). Not in cerebras-pytorch 2.10: the Model Zoo calls it on its
    GPU-distributed data paths."""
    import torch.distributed

    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def get_world_size() -> int:
    """The number of ``torch.distributed`` processes (1 when it is not initialized); see
    ``get_rank``."""
    import torch.distributed

    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def service_resolver():
    """The service resolver of this (single-host) cluster."""
    return local_service_resolver()


def num_tasks() -> int:
    """Total number of tasks in the cluster."""
    return service_resolver().cluster_resolver.num_tasks


def num_streamers() -> int:
    """Number of tasks streaming input batches."""
    return len(service_resolver().streamer_ordinals())


def num_receivers() -> int:
    """Number of tasks receiving outputs."""
    return len(service_resolver().receiver_ordinals())


def get_ordinal() -> int:
    """The rank of this task."""
    return service_resolver().cluster_resolver.rank


def get_streaming_rank() -> int:
    """The rank of this task among the streamers."""
    streamers = sorted(service_resolver().streamer_ordinals())
    ordinal = get_ordinal()
    if ordinal not in streamers:
        raise CstorchRuntimeError(f"Task {ordinal} is not a streamer.")
    return streamers.index(ordinal)


def get_streaming_batch_size(effective_batch_size: int, global_rank: Optional[int] = None) -> int:
    """The batch size a task streams (this one, or ``global_rank``): the effective (global)
    batch divided evenly among the streamers -- the whole batch in a single-process run (the
    modeled wafer splits it across its systems inside the compiled step)."""
    if not isinstance(effective_batch_size, int) or isinstance(effective_batch_size, bool):
        raise CstorchTypeError(
            f"Expected effective batch size to be an integer, but got type "
            f"{type(effective_batch_size).__name__} with value "
            f"{effective_batch_size!r}."
        )
    if effective_batch_size <= 0:
        raise CstorchValueError(
            f"Expected effective batch size to be a positive integer, but got "
            f"{effective_batch_size}."
        )
    if global_rank is not None:
        service_resolver().cluster_spec.task(global_rank)  # validates the rank
    streamers = num_streamers()
    if effective_batch_size % streamers:
        raise CstorchValueError(
            f"The effective batch size {effective_batch_size} cannot be split evenly among "
            f"the {streamers} processes that stream input; use a multiple of {streamers}."
        )
    return effective_batch_size // streamers


def is_master_ordinal(local: bool = False) -> bool:
    """True if this task is the master."""
    return service_resolver().cluster_resolver.assumes_role(TaskRole.MASTER)


def is_streamer() -> bool:
    """True if this task streams input batches."""
    return get_ordinal() in service_resolver().streamer_ordinals()


def is_receiver() -> bool:
    """True if this task receives outputs."""
    return get_ordinal() in service_resolver().receiver_ordinals()


def _dir_size(path) -> int:
    path = Path(path)
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _human(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1024 or unit == "TB":
            return f"{num_bytes:.2f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1024
    return f"{num_bytes:.2f} PB"


def hit_worker_cache_limit(src_dir: str, dest_dir: str):
    """Whether copying ``src_dir`` to ``dest_dir`` (inside ``WORKER_CACHE_ROOT``) would fill
    the worker cache past ``SSD_LIMIT``.

    Returns ``(is_limit_hit, size of src_dir, space available for it)``, sizes as human
    readable strings. ``dest_dir`` outside the cache root → ValueError.
    """
    root = Path(WORKER_CACHE_ROOT).resolve()
    Path(dest_dir).resolve().relative_to(root)  # ValueError when outside the cache
    stats = os.statvfs(root)
    capacity = stats.f_frsize * stats.f_blocks
    occupied = capacity - stats.f_frsize * stats.f_bavail
    size, replaced = _dir_size(src_dir), _dir_size(dest_dir)
    cap = SSD_LIMIT * capacity
    is_limit_hit = size + occupied - replaced > cap
    available = max(0.0, cap - occupied + replaced)
    return is_limit_hit, _human(size), _human(available)
