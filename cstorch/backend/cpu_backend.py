"""The CPU backend: JAX on the host CPU, or eager torch with ``engine="eager"``."""

from __future__ import annotations

from jax_backend import mesh

from cstorch.backend.base_backend import BaseBackend, warn_cluster_config_ignored
from cstorch.core.device import CPUDevice
from cstorch.core.engine import resolve_engine


class _Unspecified:
    def __repr__(self):
        return "<UNSPECIFIED sentinel>"


UNSPECIFIED = _Unspecified()


class CpuBackendImpl(BaseBackend):
    def __init__(self, backend_type, artifact_dir=None, mixed_precision=UNSPECIFIED, *,
                 engine: str = "auto", cluster_config=UNSPECIFIED):
        if mixed_precision is not UNSPECIFIED:
            raise ValueError(
                "The CPU backend does not take a `mixed_precision` argument. To train in mixed "
                "precision, call cstorch.amp.set_half_dtype(\"bfloat16\") (or use "
                "cstorch.amp.autocast()) instead.")
        self.engine = resolve_engine(engine)  # validated first: a bad name changes nothing
        if cluster_config is not UNSPECIFIED:
            warn_cluster_config_ignored("CPU", cluster_config)
        super().__init__(backend_type, CPUDevice(), artifact_dir or "./",
                         jax_devices=mesh.devices("cpu"))
