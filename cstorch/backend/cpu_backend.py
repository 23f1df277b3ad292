"""The CPU backend: JAX on the host CPU, or eager torch with ``engine="eager"``."""

from __future__ import annotations

import dataclasses

import torch

from cstorch.backend import precision
from cstorch.backend.base_backend import BaseBackend, warn_cluster_config_ignored
from cstorch.core.device import CPUDevice
from cstorch.core.engine import resolve_engine
from jax_backend import mesh
from jax_backend.errors import CstorchValueError
from jax_backend.user_frames import warn


class _Unspecified:
    def __repr__(self):
        return "<UNSPECIFIED sentinel>"


UNSPECIFIED = _Unspecified()


class CpuBackendImpl(BaseBackend):
    def __init__(
        self,
        backend_type,
        artifact_dir=None,
        mixed_precision=UNSPECIFIED,
        *,
        engine: str = "auto",
        cluster_config=UNSPECIFIED,
    ):
        if mixed_precision is not UNSPECIFIED and not isinstance(mixed_precision, bool):
            raise CstorchValueError(
                "The CPU backend does not take a `mixed_precision` argument. To train in mixed "
                'precision, call cstorch.amp.set_half_dtype("bfloat16") (or use '
                "cstorch.amp.autocast()) instead."
            )
        if mixed_precision is not UNSPECIFIED:
            # Releases 2.0 to 2.2 took a bool here (their Model Zoo passes it): True ran the
            # compiled model's forward under cstorch.amp.autocast(). 2.3 on refuse it.
            warn(
                'cstorch.backend("CPU", mixed_precision=...) is the 2.0-2.2 spelling; use '
                "cstorch.amp.autocast() around the forward pass instead.",
                DeprecationWarning,
            )
        # With the 2.0-2.2 keyword, precision is that generation's: the half dtype set with
        # cstorch.amp.set_half_dtype (which their Model Zoo calls on every run) does not put
        # the whole CPU step in half precision; only the forward is autocast, when True.
        self.old_precision_keyword = mixed_precision is not UNSPECIFIED
        self.autocast_forward = mixed_precision is True
        self.engine = resolve_engine(engine)  # validated first: a bad name changes nothing
        if cluster_config is not UNSPECIFIED:
            warn_cluster_config_ignored("CPU", cluster_config)
        super().__init__(
            backend_type, CPUDevice(), artifact_dir or "./", jax_devices=mesh.devices("cpu")
        )

    def precision_policy(self):
        policy = super().precision_policy()
        if self.old_precision_keyword:
            return dataclasses.replace(policy, compute_dtype=None)
        return policy

    def forward(self, model, *args, **kwargs):
        if not self.autocast_forward:
            return super().forward(model, *args, **kwargs)
        half = precision.get_half_dtype()
        if half != torch.bfloat16:  # as cstorch.amp.autocast() on CPU
            raise CstorchValueError(
                f"mixed_precision=True on the CPU backend autocasts to the half dtype, which "
                f"must be torch.bfloat16 on CPU, got {half}. Call "
                "cstorch.amp.set_half_dtype(torch.bfloat16) first."
            )
        with torch.autocast("cpu", dtype=half):
            return super().forward(model, *args, **kwargs)
