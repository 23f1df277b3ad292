"""Precision policies: which dtype floating-point compute runs in.

Parameters and optimizer state always stay in their own (fp32) dtype; a mixed-precision
policy makes the lowering compute in a half dtype. ``Policy()`` is plain full precision.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Policy:
    """``compute_dtype`` None means full precision (compute in the tensors' own dtypes)."""

    compute_dtype: object = None

    @property
    def is_mixed(self) -> bool:
        return self.compute_dtype is not None

    def node_hook(self):
        """A per-node hook for the interpreter, or None for full precision."""
        return None
