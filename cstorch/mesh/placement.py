"""Mesh entities: boxes, meshes, placements and sharding specs (plain dataclasses)."""

from __future__ import annotations

import dataclasses
from typing import List, Literal, Optional

import numpy as np

BoxDeviceType = Literal["WSE", "LocalHost", "GlobalHost"]
ShardingPartialType = Literal["SUM", "MAX", "MIN", "PROD"]


@dataclasses.dataclass
class Box:
    """One CSX with its local host and the global host."""

    id: int
    csx_id: int
    localhost_id: int
    globalhost_id: int


@dataclasses.dataclass
class Mesh:
    """A device mesh: an id and an array of ``Box``es."""

    mesh_id: int
    box_array: np.ndarray


class Placement:
    """How a tensor dimension is laid out over a mesh dimension."""

    def is_shard(self) -> bool:
        return isinstance(self, Shard)

    def is_replicate(self) -> bool:
        return isinstance(self, Replicate)


@dataclasses.dataclass
class Shard(Placement):
    """Split over mesh dimension ``dim``."""

    dim: int


@dataclasses.dataclass
class Replicate(Placement):
    """A full copy on every device of the mesh."""


@dataclasses.dataclass
class ShardingSpec:
    """Where a tensor lives: per tensor axis the mesh axis it is split over (-1: none),
    partial-reduction axes and type, and the device types it is constrained to."""

    mesh_id: int
    split_axes: List[int]
    partial_axes: Optional[List[int]]
    partial_type: Optional[ShardingPartialType]
    devices: Optional[List[BoxDeviceType]]
