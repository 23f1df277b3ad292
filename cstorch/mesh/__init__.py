"""Device meshes, placements and mesh collectives (identity off a real cluster)."""

from cstorch.mesh.api import (
    all_gather,
    all_slice,
    d2d_transfer,
    distribute_tensor,
    m2m_transfer,
    replicate as replicate,
    shard as shard,
    sharding_spec,
)
from cstorch.mesh.placement import (
    Box,
    BoxDeviceType,
    Mesh,
    Placement,
    Replicate,
    Shard,
    ShardingSpec,
)

__all__ = [
    "Box",
    "Mesh",
    "ShardingSpec",
    "Placement",
    "Shard",
    "Replicate",
    "BoxDeviceType",
    "sharding_spec",
    "distribute_tensor",
    "d2d_transfer",
    "m2m_transfer",
    "all_slice",
    "all_gather",
]
