"""The CSX backend: a modeled Cerebras wafer on JAX devices.

The wafer's programming model is kept: the step is compiled once and may never change
(a new input signature raises instead of recompiling) and training runs in mixed precision
by default (float16, the reference's default half dtype): ``cstorch.amp.set_half_dtype``
chooses another, ``cstorch.amp.enable_mixed_precision(False)`` float32, called before or
after the backend is created (``cstorch.backend.precision``). ``cluster_config.num_csx`` systems become the data-parallel axis of a
``(csx, ws)`` device mesh, and weight servers (``max_wgt_servers > 0``) shard parameters and
optimizer state over it (see ``jax_backend.mesh``). With ``cluster_config.distributed`` (or
the environment, see ``cstorch.distributed.runtime``) the backend first joins a multi-process
JAX job and the mesh spans the devices of every process.

As on a real system, step-closure values are "received from the appliance": hooks registered
with ``register_before_tensor_to_cpu`` / ``register_after_tensor_to_cpu`` run around each
device value a closure gets (the Model Zoo's profiler times steps with them).

The wafer cluster is modeled locally: ``cluster`` is a ``ClusterManager`` holding the
``cerebras.appliance`` workflow of this run (an id; starting and stopping it only logs), and
``appliance`` is the object that would stream this run's data (its ``client`` is None, as
nothing talks to a real cluster).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import OrderedDict
from typing import Callable, Dict

import torch
from torch.utils._pytree import keystr, tree_flatten_with_path, tree_unflatten
from torch.utils.hooks import RemovableHandle

from cstorch import config
from cstorch.backend import precision
from cstorch.backend.base_backend import BaseBackend
from cstorch.core.device import LazyDevice
from cstorch.distributed import runtime
from jax_backend import LazyTensor, mesh
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError, CstorchValueError


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
    def __init__(
        self,
        backend_type,
        artifact_dir=None,
        compile_dir="cached_compile",
        compile_only=False,
        validate_only=False,
        cluster_config=None,
    ):
        from cstorch.distributed.cluster_config import ClusterConfig

        if cluster_config is None:
            cluster_config = ClusterConfig()
        if not isinstance(cluster_config, ClusterConfig):
            raise CstorchTypeError(
                f"cluster_config must be a cstorch.distributed.ClusterConfig, got "
                f"{type(cluster_config).__name__}."
            )
        if cluster_config.num_csx is not None and cluster_config.num_csx <= 0:
            raise CstorchValueError(
                f"cluster_config.num_csx must be a positive number of systems, got "
                f"{cluster_config.num_csx}."
            )
        config.torch_num_threads.value  # noqa: B018 - raises unless a positive integer
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
            layout = mesh.Layout.build(
                devices,
                num_csx,
                _devices_per_csx(len(devices), num_csx, weight_servers, multi_process),
                shard_state=weight_servers > 0,
            )
        super().__init__(
            backend_type,
            LazyDevice(),
            artifact_dir or "./cerebras_logs",
            jax_devices=devices,
            layout=layout,
        )
        precision.set_backend_default(True)  # unless the user chose (before or after)
        self.cluster = ClusterManager(cluster_config)
        self.appliance = None  # set by the first run: the (local) appliance of this run
        self.appliance_tracker.stop("Initialization")

    def fetch_closure_values(self, values):
        leaves, spec = tree_flatten_with_path(values)
        fetched = []
        for path, leaf in leaves:
            if isinstance(leaf, LazyTensor):
                name = f"closure_arg{keystr(path)}"
                for hook in list(_before_tensor_to_cpu_hooks.values()):
                    hook(leaf, name)
                leaf = leaf.materialize()
                for hook in list(_after_tensor_to_cpu_hooks.values()):
                    hook(leaf, name)
            fetched.append(leaf)
        return tree_unflatten(fetched, spec)

    @property
    def is_e2e_execution(self) -> bool:
        return not (self.compile_only or self.validate_only)

    def shutdown(self) -> None:
        super().shutdown()
        precision.set_backend_default(False)

    @property
    def num_csx(self) -> int:
        return self.cluster_config.num_csx or 1


TensorToCpuHook = Callable[[torch.Tensor, str], None]
_before_tensor_to_cpu_hooks: Dict[int, TensorToCpuHook] = OrderedDict()
_after_tensor_to_cpu_hooks: Dict[int, TensorToCpuHook] = OrderedDict()


def register_before_tensor_to_cpu(hook: TensorToCpuHook) -> RemovableHandle:
    """Calls ``hook(device_tensor, name)`` before each device value a step closure receives
    on CSX is copied to the host. Returns a handle whose ``remove()`` unregisters it."""
    handle = RemovableHandle(_before_tensor_to_cpu_hooks)
    _before_tensor_to_cpu_hooks[handle.id] = hook
    return handle


def register_after_tensor_to_cpu(hook: TensorToCpuHook) -> RemovableHandle:
    """Calls ``hook(cpu_tensor, name)`` after each device value a step closure receives on
    CSX has been copied to the host. Returns a handle whose ``remove()`` unregisters it."""
    handle = RemovableHandle(_after_tensor_to_cpu_hooks)
    _after_tensor_to_cpu_hooks[handle.id] = hook
    return handle


class ClusterManager:
    """The wafer cluster of a CSX run, modeled locally.

    A workflow groups the jobs of a run on a real cluster. Here ``start_workflow`` gives the run
    a local workflow id (kept in ``config.workflow_id``) and ``stop_workflow`` ends it; both
    only log. ``client`` is None: nothing talks to a management server.
    """

    _ids = itertools.count(1)

    def __init__(self, config):
        self.logger = logging.getLogger("cerebras.pytorch.ClusterManager")
        self.config = config

    @property
    def config(self):
        return self._config

    @config.setter
    def config(self, value):
        from cstorch.distributed.cluster_config import ClusterConfig

        if not isinstance(value, ClusterConfig):
            raise CstorchTypeError(f"Expected a ClusterConfig, got {type(value).__name__}.")
        running = getattr(self, "_config", None)
        if running is not None and running.workflow_id is not None:
            value.workflow_id = running.workflow_id  # a running workflow survives the change
        self._config = value

    @property
    def workflow_id(self):
        return self.config.workflow_id

    @property
    def client(self):
        return None

    def start_workflow(self, lock_resources: bool = True) -> bool:
        """Starts this run's (local) workflow; True when it was started by this call."""
        if self.workflow_id is not None:
            return False
        self.config.workflow_id = f"wflow-local-{os.getpid()}-{next(self._ids)}"
        self.logger.info(
            f"Started local workflow {self.workflow_id} "
            f"(lock_resources={lock_resources}; no cluster is contacted)."
        )
        return True

    def stop_workflow(self) -> None:
        if self.workflow_id is not None:
            self.logger.info(f"Stopped local workflow {self.workflow_id}.")
            self.config.workflow_id = None

    def check_storage_connectivity(self) -> bool:
        return False  # no cluster: nothing to check, as the reference does without a client

    def active_resources(self):
        if self.workflow_id is None:
            raise CstorchRuntimeError("No workflow has been started: call start_workflow() first.")
        return self.config.num_csx
