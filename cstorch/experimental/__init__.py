"""Features under development (backward compatibility not guaranteed)."""

from cstorch.experimental import listener
from cstorch.experimental.compression import Compression
from cstorch.experimental.implicit_loop import (
    get_loop_iteration_slice,
    start_implicit_loop,
    update_implicit_loop,
)

__all__ = [
    "Compression",
    "get_loop_iteration_slice",
    "listener",
    "start_implicit_loop",
    "update_implicit_loop",
]
