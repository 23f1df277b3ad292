"""Sharding annotations and mesh collectives.

On a Cerebras cluster these become mesh operations of the compiled graph. This
implementation validates their arguments exactly as the reference does and returns the input
unchanged: the modeled wafer's data parallelism is laid out by the backend, not by these
annotations.
"""

from __future__ import annotations

import typing
from typing import List, Optional, Union

import torch

from cstorch.mesh.placement import (
    BoxDeviceType,
    Mesh,
    Replicate,
    Shard,
    ShardingSpec,
)
from jax_backend.errors import CstorchTypeError, CstorchValueError

_DEVICES = typing.get_args(BoxDeviceType)


def shard(dim: int) -> Shard:
    """A ``Shard`` placement over mesh dimension ``dim``."""
    return Shard(dim)


def replicate() -> Replicate:
    """A ``Replicate`` placement."""
    return Replicate()


def sharding_spec(
    sharding_array: List[Union[Replicate, Shard]], mesh: Mesh, device: Optional[str] = None
) -> ShardingSpec:
    """The ``ShardingSpec`` of a per-axis placement list on ``mesh`` (optionally constrained
    to ``device``: "WSE", "LocalHost" or "GlobalHost"; the global host holds only replicated
    tensors)."""
    if device and device not in _DEVICES:
        raise CstorchValueError(f"Expected `device` to be one of: {_DEVICES}, got {device!r}.")
    if not all(isinstance(p, (Replicate, Shard)) for p in sharding_array):
        raise CstorchTypeError(
            "Expected `sharding_array` to contain `Replicate` and `Shard` instances only."
        )
    if device == "GlobalHost" and not all(isinstance(p, Replicate) for p in sharding_array):
        raise CstorchTypeError(
            "Expected all sharding_array items to be `Replicate` for the `GlobalHost` device type."
        )
    split_axes = [i if p.is_shard() else -1 for i, p in enumerate(sharding_array)]
    return ShardingSpec(mesh.mesh_id, split_axes, None, None, [device] if device else None)


def _check_names(names, num_sharded):
    if len(names) != num_sharded:
        raise CstorchValueError(
            f"Expected `names` length {len(names)} to match the number of sharded "
            f"axes {num_sharded}."
        )


def distribute_tensor(
    tensor: torch.Tensor, sharding_spec: ShardingSpec, names: List[str]
) -> torch.Tensor:
    """``tensor`` laid out as ``sharding_spec`` says (one name per sharded axis)."""
    rank = tensor.dim()
    if sharding_spec.split_axes and len(sharding_spec.split_axes) != rank:
        raise CstorchValueError(
            f"Split axes {len(sharding_spec.split_axes)} do not match the tensor rank {rank}."
        )
    _check_names(names, sum(1 for axis in sharding_spec.split_axes if axis != -1))
    if sharding_spec.partial_axes:
        if len(sharding_spec.partial_axes) > rank:
            raise CstorchValueError(
                f"Partial axes {len(sharding_spec.partial_axes)} exceed tensor rank {rank}."
            )
        if sharding_spec.partial_axes == sharding_spec.split_axes:
            raise CstorchValueError(
                f"Partial axes {sharding_spec.partial_axes} and split axes "
                f"{sharding_spec.split_axes} cannot be the same."
            )
    return tensor


def d2d_transfer(tensor: torch.Tensor, dst_device: str) -> torch.Tensor:
    """A replicated ``tensor`` moved to ``dst_device`` within its mesh."""
    if dst_device not in _DEVICES:
        raise CstorchTypeError(
            f"Expected `dst_device` to be one of {_DEVICES}, got {dst_device!r}."
        )
    return tensor


def m2m_transfer(
    tensor: torch.Tensor, src_mesh: Mesh, dst_mesh: Mesh, src_root_id=0
) -> torch.Tensor:
    """``tensor`` moved from ``src_mesh`` to ``dst_mesh``."""
    for name, mesh in (("src_mesh", src_mesh), ("dst_mesh", dst_mesh)):
        if not isinstance(mesh, Mesh):
            raise CstorchTypeError(f"Expected `{name}` to be a Mesh, got {type(mesh).__name__}.")
    return tensor


def all_slice(
    tensor: torch.Tensor, sharding_array: List[Union[Replicate, Shard]], names: List[str]
) -> torch.Tensor:
    """A replicated ``tensor`` sliced as ``sharding_array`` says."""
    if len(sharding_array) > tensor.dim():
        raise CstorchValueError(
            f"Expected length of `sharding_array` {len(sharding_array)} to be at "
            f"most the tensor rank {tensor.dim()}."
        )
    if not all(isinstance(p, (Replicate, Shard)) for p in sharding_array):
        raise CstorchValueError(
            "Expected all placements in `sharding_array` to be instances of `Replicate` or `Shard`."
        )
    _check_names(names, sum(1 for p in sharding_array if isinstance(p, Shard)))
    return tensor


def all_gather(tensor: torch.Tensor, gather_axes: List[int]) -> torch.Tensor:
    """A sharded ``tensor`` gathered along ``gather_axes`` (each in [0, rank))."""
    for i, axis in enumerate(gather_axes):
        if axis < 0:
            raise CstorchValueError(
                f"All gather axes must be non-negative, got {gather_axes} at index "
                f"gather_axes[{i}]."
            )
        if axis >= tensor.dim():
            raise CstorchValueError(
                f"Gather axis {axis} exceeds the tensor rank {tensor.dim()} at index "
                f"gather_axes[{i}]."
            )
    return tensor
