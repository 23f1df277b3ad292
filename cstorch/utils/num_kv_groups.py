"""``groups_annotater``: tell the (modeled) compiler how many key/value head groups an
attention function uses."""

from __future__ import annotations

import dataclasses
from typing import Optional

from cstorch.backend import use_cs
from cstorch.core.annotation import AnnotationMode, create_annotation
from jax_backend.errors import CstorchTypeError


@dataclasses.dataclass
class GroupsConfig(AnnotationMode.Config):
    num_kv_groups: Optional[int] = None
    enable_fwd: bool = True
    enable_bwd: bool = True

    def __post_init__(self):
        if not isinstance(self.num_kv_groups, (int, type(None))):
            raise CstorchTypeError(
                f"num_kv_groups must be an int or None, got {type(self.num_kv_groups).__name__}."
            )


def get_attribute(config: GroupsConfig, is_backward: bool) -> AnnotationMode.Attribute:
    return AnnotationMode.Attribute("num_kv_groups", config.num_kv_groups)


def groups_annotater(num_kv_groups: Optional[int] = None):
    """A decorator tagging the function's ops with ``num_kv_groups`` on CSX; the identity
    elsewhere."""
    if not use_cs():
        return lambda fn: fn
    return create_annotation(GroupsConfig, get_attribute, num_kv_groups=num_kv_groups)
