"""The GPU backend: JAX on a CUDA/ROCm device; torch tensors stay on the host.

With ``enable_distributed=True`` under torchrun or ``python -m cstorch.distributed.launch``
the backend joins the multi-process JAX job (``cstorch.distributed.runtime``) and trains
data-parallel over the GPUs of every process (closures run on process 0)."""

from __future__ import annotations

import os

from cstorch.backend.base_backend import BaseBackend, warn_cluster_config_ignored
from cstorch.backend.cpu_backend import UNSPECIFIED
from cstorch.core.device import GPUDevice
from cstorch.distributed import runtime
from jax_backend import mesh
from jax_backend.errors import CstorchRuntimeError


class GpuBackendImpl(BaseBackend):
    def __init__(
        self,
        backend_type,
        artifact_dir=None,
        enable_distributed=False,
        main_process_id=0,
        dist_backend="nccl",
        init_method=None,
        sync_batchnorm=False,
        *,
        cluster_config=UNSPECIFIED,
    ):
        if cluster_config is not UNSPECIFIED:
            warn_cluster_config_ignored("GPU", cluster_config)
        multi_process = False
        if enable_distributed:
            if runtime.ENV_NUM_PROCESSES in os.environ:
                multi_process = runtime.join()
            elif "LOCAL_RANK" in os.environ:
                multi_process = runtime.join(runtime.DistributedConfig.from_torchrun_env())
            else:
                raise CstorchRuntimeError(
                    "enable_distributed=True needs the process to be launched by a "
                    "multi-process launcher: torchrun (LOCAL_RANK) or `python -m "
                    "cstorch.distributed.launch`."
                )
        devices = mesh.devices("gpu")
        if not devices:
            raise CstorchRuntimeError(
                "The GPU backend was requested but JAX finds no GPU on this machine "
                f"(platforms: {mesh.platforms()}). Install a "
                'GPU-enabled jaxlib, or use cstorch.backend("CPU").'
            )
        self.enable_distributed = enable_distributed
        self.main_process_id = main_process_id
        self.dist_backend = dist_backend
        self.init_method = init_method
        self.sync_batchnorm = sync_batchnorm
        # A multi-process job trains data-parallel over every process's GPUs.
        layout = mesh.Layout.data_parallel(devices, len(devices)) if multi_process else None
        super().__init__(
            backend_type,
            GPUDevice(enable_distributed, dist_backend, init_method),
            artifact_dir or "./",
            jax_devices=devices[:1] if layout is None else devices,
            layout=layout,
        )
