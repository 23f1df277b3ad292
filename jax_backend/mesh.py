"""JAX devices, meshes and how a program's arrays are laid out on them (no torch here).

The modeled wafer runs a step data-parallel over ``num_replicas`` devices: batch inputs are
split along their first dimension over the mesh axis ``"csx"`` and XLA's SPMD partitioner
inserts the gradient reductions, so the numbers are those of the whole batch on one device.
With weight servers, parameters and optimizer state are also split along their first
dimension (the weights are "streamed": gathered where they are used), like ZeRO/FSDP.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "csx"


def devices(platform: str | None = None) -> list:
    """The JAX devices of a platform ("cpu", "gpu"), or of the default platform; [] if none."""
    try:
        return list(jax.devices(platform)) if platform else list(jax.devices())
    except RuntimeError:
        return []


def platforms() -> list:
    return sorted({d.platform for d in jax.devices()})


@dataclasses.dataclass(frozen=True)
class Layout:
    """Placement of a program's state and inputs on a 1-D device mesh."""

    mesh: Mesh
    shard_state: bool = False

    @classmethod
    def data_parallel(cls, available: list, num_replicas: int, shard_state: bool = False):
        if num_replicas > len(available):
            raise RuntimeError(
                f"{num_replicas} replicas were requested but only {len(available)} JAX "
                f"device(s) exist. On CPU, model more devices with "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={num_replicas} (set before "
                "JAX starts).")
        return cls(Mesh(np.array(available[:num_replicas]), (AXIS,)), shard_state)

    @property
    def size(self) -> int:
        return self.mesh.size

    def _split_first_dim(self, shape) -> NamedSharding:
        if len(shape) and shape[0] % self.size == 0:
            return NamedSharding(self.mesh, PartitionSpec(AXIS))
        return NamedSharding(self.mesh, PartitionSpec())

    def state_sharding(self, shape) -> NamedSharding:
        if self.shard_state:
            return self._split_first_dim(shape)
        return NamedSharding(self.mesh, PartitionSpec())

    def input_sharding(self, shape) -> NamedSharding:
        """Batch inputs are split along dim 0 (when it divides evenly, else replicated)."""
        return self._split_first_dim(shape)

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def place_state(self, array):
        return jax.device_put(array, self.state_sharding(array.shape))
