"""The CSX backend: a modeled Cerebras wafer on JAX devices.

The wafer's programming model is kept: the step is compiled once and may never change
(a new input signature raises instead of recompiling) and training always runs in mixed
precision. ``cluster_config.num_csx`` systems become the data-parallel axis of a
``(csx, ws)`` device mesh, and weight servers (``max_wgt_servers > 0``) shard parameters and
optimizer state over it (see ``jax_backend.mesh``). With ``cluster_config.distributed`` (or
the environment, see ``cstorch.distributed.runtime``) the backend first joins a multi-process
JAX job and the mesh spans the devices of every process.
"""

from __future__ import annotations

import os

from jax_backend import mesh

from cstorch.backend.base_backend import BaseBackend
from cstorch.core.device import LazyDevice
from cstorch.distributed import runtime


def _devices_per_csx(num_devices, num_csx, weight_servers, multi_process) -> int:
    """How many devices model one system: all of a multi-process job's devices are used;
    on one process, weight servers add a ``ws`` mesh axis of up to ``max_wgt_servers``
    devices per system (as many as there are)."""
    if multi_process:
        return max(1, num_devices // num_csx)
    if weight_servers > 0:
        return max(1, min(weight_servers, num_devices // num_csx))
    return 1


class PyTorchLtcBackendImpl(BaseBackend):
    def __init__(self, backend_type, artifact_dir=None, compile_dir="cached_compile",
                 compile_only=False, validate_only=False, cluster_config=None):
        from cstorch.distributed.cluster_config import ClusterConfig

        if cluster_config is None:
            cluster_config = ClusterConfig()
        if not isinstance(cluster_config, ClusterConfig):
            raise TypeError(
                f"cluster_config must be a cstorch.distributed.ClusterConfig, got "
                f"{type(cluster_config).__name__}.")
        if cluster_config.num_csx is not None and cluster_config.num_csx <= 0:
            raise ValueError(
                f"cluster_config.num_csx must be a positive number of systems, got "
                f"{cluster_config.num_csx}.")
        threads = os.environ.get("TORCH_NUM_THREADS")
        if threads is not None and (not threads.isdigit() or int(threads) <= 0):
            raise ValueError(f"TORCH_NUM_THREADS must be a positive integer, got {threads!r}.")
        self.cluster_config = cluster_config
        self.compile_dir = compile_dir
        self.compile_only = compile_only
        self.validate_only = validate_only
        multi_process = runtime.join(cluster_config.distributed)
        devices = mesh.devices()
        num_csx = cluster_config.num_csx or 1
        weight_servers = cluster_config.max_wgt_servers
        layout = None
        if num_csx > 1 or weight_servers > 0 or multi_process:
            layout = mesh.Layout.build(devices, num_csx,
                                       _devices_per_csx(len(devices), num_csx, weight_servers,
                                                        multi_process),
                                       shard_state=weight_servers > 0)
        super().__init__(backend_type, LazyDevice(), artifact_dir or "./cerebras_logs",
                         jax_devices=devices, layout=layout)
        from cstorch import amp

        amp.enable_mixed_precision(True)

    @property
    def is_e2e_execution(self) -> bool:
        return not (self.compile_only or self.validate_only)

    @property
    def num_csx(self) -> int:
        return self.cluster_config.num_csx or 1
