"""Device meshes, placements and mesh collectives (identity off a real cluster)."""

from cstorch.mesh.api import all_gather
from cstorch.mesh.api import all_slice
from cstorch.mesh.api import d2d_transfer
from cstorch.mesh.api import distribute_tensor
from cstorch.mesh.api import m2m_transfer
from cstorch.mesh.api import replicate as replicate
from cstorch.mesh.api import shard as shard
from cstorch.mesh.api import sharding_spec
from cstorch.mesh.placement import Box
from cstorch.mesh.placement import BoxDeviceType
from cstorch.mesh.placement import Mesh
from cstorch.mesh.placement import Placement
from cstorch.mesh.placement import Replicate
from cstorch.mesh.placement import Shard
from cstorch.mesh.placement import ShardingSpec

__all__ = [
    "Box", "Mesh", "ShardingSpec", "Placement", "Shard", "Replicate", "BoxDeviceType",
    "sharding_spec", "distribute_tensor", "d2d_transfer", "m2m_transfer", "all_slice",
    "all_gather",
]
