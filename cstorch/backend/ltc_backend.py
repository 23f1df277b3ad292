"""The CSX backend: a modeled Cerebras wafer on JAX devices.

The wafer's programming model is kept: the step is compiled once and may never change
(a new input signature raises instead of recompiling) and training always runs in mixed
precision. ``cluster_config.num_csx`` systems become a data-parallel mesh axis over the
available JAX devices, and weight servers (``max_wgt_servers > 0``) shard parameters and
optimizer state over it (see ``jax_backend.mesh``).
"""

from __future__ import annotations

import os

from jax_backend import mesh

from cstorch.backend import precision
from cstorch.backend.base_backend import BaseBackend
from cstorch.core.device import LazyDevice


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
        devices = mesh.devices()
        num_csx = cluster_config.num_csx or 1
        layout = None
        if num_csx > 1 or cluster_config.max_wgt_servers > 0:
            layout = mesh.Layout.data_parallel(devices, num_csx,
                                               shard_state=cluster_config.max_wgt_servers > 0)
        super().__init__(backend_type, LazyDevice(), artifact_dir or "./cerebras_logs",
                         jax_devices=devices, layout=layout)
        precision.enable_mixed_precision(True)

    @property
    def is_e2e_execution(self) -> bool:
        return not (self.compile_only or self.validate_only)

    @property
    def num_csx(self) -> int:
        return self.cluster_config.num_csx or 1
