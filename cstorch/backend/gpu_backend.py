"""The GPU backend: JAX on a CUDA/ROCm device; torch tensors stay on the host."""

from __future__ import annotations

import os

from jax_backend import mesh

from cstorch.backend.base_backend import BaseBackend, warn_cluster_config_ignored
from cstorch.backend.cpu_backend import _UNSPECIFIED
from cstorch.core.device import GPUDevice


class GpuBackendImpl(BaseBackend):
    def __init__(self, backend_type, artifact_dir=None, enable_distributed=False,
                 main_process_id=0, dist_backend="nccl", init_method=None,
                 sync_batchnorm=False, *, cluster_config=_UNSPECIFIED):
        if cluster_config is not _UNSPECIFIED:
            warn_cluster_config_ignored("GPU", cluster_config)
        devices = mesh.devices("gpu")
        if not devices:
            raise RuntimeError(
                "The GPU backend was requested but JAX finds no GPU on this machine "
                f"(platforms: {mesh.platforms()}). Install a "
                "GPU-enabled jaxlib, or use cstorch.backend(\"CPU\").")
        if enable_distributed and "LOCAL_RANK" not in os.environ:
            raise RuntimeError(
                "enable_distributed=True needs the process to be launched by a multi-process "
                "launcher that sets LOCAL_RANK (e.g. torchrun).")
        self.enable_distributed = enable_distributed
        self.main_process_id = main_process_id
        self.dist_backend = dist_backend
        self.init_method = init_method
        self.sync_batchnorm = sync_batchnorm
        super().__init__(backend_type, GPUDevice(enable_distributed, dist_backend, init_method),
                         artifact_dir or "./", jax_devices=devices[:1])
