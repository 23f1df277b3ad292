"""``BackendType``: CPU, GPU or CSX. A leaf module, so devices and backends can both use it."""

from __future__ import annotations

import enum

from jax_backend.errors import CstorchValueError


class BackendType(enum.Enum):
    CPU = "CPU"
    GPU = "GPU"
    CSX = "CSX"

    @property
    def is_cpu(self) -> bool:
        return self is BackendType.CPU

    @property
    def is_gpu(self) -> bool:
        return self is BackendType.GPU

    @property
    def is_csx(self) -> bool:
        return self is BackendType.CSX

    @staticmethod
    def from_str(backend_type: str) -> "BackendType":
        try:
            return BackendType[backend_type.upper()]
        except KeyError:
            raise CstorchValueError(
                f"Invalid backend type: {backend_type!r}. Valid backend types are: "
                f"{', '.join(t.name for t in BackendType)}."
            ) from None
