"""User-registered ATen decompositions (see ``registry``)."""

from cstorch.decomp import registry
from cstorch.decomp.registry import register_decomposition

__all__ = ["register_decomposition", "registry"]
