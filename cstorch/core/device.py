"""Devices of the cstorch API. On this implementation every device keeps torch tensors on the
host CPU (torch sees ``cpu:0``); where the numbers are computed is decided by the backend's
JAX devices."""

from __future__ import annotations

import contextlib

import torch
from torch.utils._pytree import tree_map

from cstorch.backend.backend_type import BackendType


class Device(contextlib.ContextDecorator):
    """A cstorch device: its ``torch_device`` is where the user's torch tensors live."""

    def __init__(self, device_type: str):
        self.type = device_type
        self.torch_device = torch.device("cpu", index=0)
        self.artifact_dir = None

    def __str__(self):
        return self.type

    def __repr__(self):
        return f"device(type='{self.type.lower()}')"

    def move_to_device(self, struct):
        return tree_map(lambda x: x.to(self.torch_device) if isinstance(x, torch.Tensor) else x,
                        struct)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class CPUDevice(Device):
    def __init__(self):
        super().__init__("CPU")


class GPUDevice(Device):
    def __init__(self, enable_distributed=False, dist_backend="nccl", init_method=None):
        super().__init__("GPU")
        self.enable_distributed = enable_distributed
        self.dist_backend = dist_backend
        self.init_method = init_method


class LazyDevice(Device):
    """The modeled wafer ("CSX")."""

    def __init__(self):
        super().__init__("CSX")


def device(backend_type, *args, **kwargs) -> Device:
    """Builds a bare device object (it does not create a backend)."""
    backend_type = BackendType.from_str(backend_type) if isinstance(backend_type, str) else (
        backend_type)
    if backend_type == BackendType.CPU:
        return CPUDevice(*args, **kwargs)
    if backend_type == BackendType.GPU:
        return GPUDevice(*args, **kwargs)
    return LazyDevice(*args, **kwargs)
