"""What a step is lowered for: the platform it runs on and torch's float32 matmul setting.

Lowerings are plain functions of arrays; the few choices that depend on where the program
runs (cuDNN's fused attention on an NVIDIA GPU, XLA's elsewhere) or on a process-wide torch
setting (TF32 for float32 matmuls) read the current ``Target``, which ``Program`` sets around
the graph interpreter. Without one (lowerings called directly, op tests) the default target
is the portable, full-precision one.

``platform``: "cpu", "cuda", "rocm", "tpu", or "any" (nothing vendor-specific: what an export
for several platforms gets). ``float32_matmul``: torch's ``get_float32_matmul_precision()``
("highest": full fp32, as torch's default; "high": TF32 allowed; "medium": bf16 allowed).
``attention``: "auto" (the platform's fastest implementation that supports the call),
"xla" (never cuDNN), or "cudnn" (cuDNN wherever it supports the call, else XLA with a
warning); the process default comes from ``CSTORCH_ATTENTION``. ``torch_kernels``: the
kinds of op (``ops.torch_kernels.KINDS``) whose lowering calls torch's own CPU kernels on the
host, and ``native_kernels`` those of them called through the engine's FFI library rather
than a host callback; ``layout_copies``: whether half-precision dots may take an operand
through the engine's native layout copy (``ops.layout_copy``); ``native_optimizer``: whether
the Adam family's and SGD's updates may run as the engine's fused FFI call
(``native_optimizer``); ``native_ops``: the ops whose float32 lowerings may call the engine's
own FFI kernels (``program.NATIVE_OPS``: "layer_norm", "embedding", "loss"). Only the
engine's own CPU program sets these (``Program``), never an
export or the default target.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

import torch

from jax_backend import config
from jax_backend.errors import CstorchValueError

FLOAT32_MATMUL = ("highest", "high", "medium")
ATTENTION = config.attention.choices  # ("auto", "xla", "cudnn"), declared with the setting


@dataclasses.dataclass(frozen=True)
class Target:
    platform: str = "any"
    float32_matmul: str = "highest"
    attention: str = "auto"
    torch_kernels: frozenset = frozenset()
    native_kernels: frozenset = frozenset()
    layout_copies: bool = False
    native_optimizer: bool = False
    native_ops: frozenset = frozenset()

    def __post_init__(self):
        if self.float32_matmul not in FLOAT32_MATMUL:
            raise CstorchValueError(
                f"float32_matmul must be one of {FLOAT32_MATMUL}, got {self.float32_matmul!r}."
            )
        if self.attention not in ATTENTION:
            raise CstorchValueError(
                f"attention must be one of {ATTENTION}, got {self.attention!r} "
                "(check CSTORCH_ATTENTION)."
            )


_current = contextvars.ContextVar("jax_backend_target", default=Target())


def current() -> Target:
    return _current.get()


@contextlib.contextmanager
def lowering_for(target: Target):
    """Lowerings called inside the block lower for ``target``."""
    token = _current.set(target)
    try:
        yield target
    finally:
        _current.reset(token)


def platform_of(device) -> str:
    """The platform name of a JAX device: "cuda" or "rocm" for GPUs (JAX calls both "gpu")."""
    if device.platform != "gpu":
        return device.platform
    version = str(getattr(getattr(device, "client", None), "platform_version", "")).lower()
    if "rocm" in version or "hip" in version:
        return "rocm"
    return "cuda"


def attention_setting() -> str:
    """The process default for ``Target.attention`` (``CSTORCH_ATTENTION``, default "auto")."""
    return config.attention.value  # (one of ATTENTION: checked where it is declared)


_NEW_API_NAMES = {"ieee": "highest", "tf32": "high", "bf16": "medium"}


def torch_float32_matmul() -> str:
    """torch's float32 matmul precision ("highest", "high" or "medium").

    ``torch.get_float32_matmul_precision()`` follows ``torch.backends.cuda.matmul.allow_tf32``;
    newer torch raises there once the per-backend API (``...matmul.fp32_precision``) has been
    used as well, and then that setting is the answer."""
    try:
        value = torch.get_float32_matmul_precision()
    except RuntimeError:
        matmul = getattr(getattr(torch.backends, "cuda", None), "matmul", None)
        value = _NEW_API_NAMES.get(str(getattr(matmul, "fp32_precision", "ieee")), "highest")
    return value if value in FLOAT32_MATMUL else "highest"
