"""Picks the cstorch backend: from a device string, or a backend object the user built."""

from __future__ import annotations

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback
from cstorch.backend import get_or_create

DEVICE_TYPES = ("CSX", "CPU", "GPU")


class BackendCallback(CoreCallback):
    """``device`` ("CSX", "CPU", "GPU", any case) creates (or reuses) the process backend;
    ``backend`` is an existing ``cstorch.backend`` object. Exactly one of them is given."""

    def __init__(self, backend, device):
        self.backend = backend
        self.device = device

    def pre_setup(self, trainer):
        if self.backend is not None:
            if self.device is not None:
                raise ValueError(
                    "backend and device are mutually exclusive arguments of Trainer. Please "
                    "only provide one or the other."
                )
            if not isinstance(self.backend, cstorch.backend.Backend):
                raise TypeError(
                    f"Expected backend to be a cstorch.backend.Backend (from "
                    f"cstorch.backend(...)), got {type(self.backend).__name__}."
                )
            trainer.backend = self.backend
            self.backend.artifact_dir = str(trainer.artifact_dir)
            return
        if not isinstance(self.device, str):
            raise RuntimeError(
                "Trainer expected a backend object or a device string: pass "
                'device="CPU" (or "GPU", "CSX"), or backend=cstorch.backend(...).'
            )
        if self.device.upper() not in DEVICE_TYPES:
            raise ValueError(
                f"Invalid device type: {self.device!r}. Expected one of {', '.join(DEVICE_TYPES)}."
            )
        wanted = self.device.upper()
        trainer.backend = get_or_create(
            wanted,
            artifact_dir=str(trainer.artifact_dir),
            mismatch=lambda existing: ValueError(
                f"Cannot instantiate multiple trainers with different device types: a "
                f"{existing.backend_type.name} backend already exists in this process and "
                f"this Trainer asks for {wanted}. Use one device type per process."
            ),
        )
        trainer.backend.artifact_dir = str(trainer.artifact_dir)
