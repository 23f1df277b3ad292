"""The process-wide half-precision setting (``cstorch.amp.set_half_dtype``,
``mixed_precision``, ...) and the engine policy it implies (``current_policy``).

Whether a run is in mixed precision is the user's choice where the user made one
(``enable_mixed_precision``, ``set_half_dtype``), before or after the backend is created;
otherwise the backend's default: off, except on CSX (the wafer trains in mixed precision, in
float16 unless another half dtype is set), which says so with ``set_backend_default``.

It lives with the backend, which reads it to compile each step, rather than in ``cstorch.amp``,
which builds on the backend: a leaf module keeps the imports flowing one way."""

from __future__ import annotations

import torch

from cstorch import config
from jax_backend.errors import CstorchValueError
from jax_backend.precision import Policy
from jax_backend.target import torch_float32_matmul

_HALF_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "cbfloat16": torch.float16,  # its proxy dtype; the engine holds the values as cbfloat16
}


class _AmpState:
    half_dtype_str = "float16"
    mixed_precision = None  # the user's choice; None: none made, the backend's default holds
    backend_default = False  # the current backend's default (CSX: on)


def amp_settings() -> list:
    """``[half dtype name, mixed precision on]``: the process-wide settings a step reads."""
    return [_AmpState.half_dtype_str, mixed_precision()]


def _reset() -> None:
    _AmpState.half_dtype_str = "float16"
    _AmpState.mixed_precision = None
    _AmpState.backend_default = False


config.config.on_reset(_reset)
# Read while a step is traced (the capture's autocast): a graph cache entry holds for the
# values it was captured under.
config.config.include_in_graph_key("cstorch.amp", amp_settings)


def mixed_precision() -> bool:
    """Whether steps run in mixed precision: the user's choice, else the backend's default."""
    if _AmpState.mixed_precision is None:
        return _AmpState.backend_default
    return _AmpState.mixed_precision


def set_backend_default(mixed: bool) -> None:
    """The backend's default, which holds unless the user chose (before or after the backend
    was created): the CSX backend sets True while it lives, False when torn down."""
    _AmpState.backend_default = bool(mixed)


def enable_mixed_precision(enable: bool = True) -> bool:
    if not isinstance(enable, bool):
        raise CstorchValueError(f"enable_mixed_precision expects a bool, got {enable!r}.")
    _AmpState.mixed_precision = enable
    return enable


def set_half_dtype(value) -> torch.dtype:
    """Sets the half dtype ("float16", "bfloat16", "cbfloat16" or the torch dtype) and turns
    mixed precision on. Returns the torch dtype used for compute."""
    if isinstance(value, torch.dtype):
        names = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
        if value not in names:
            raise CstorchValueError(
                f"Invalid half dtype {value}; expected torch.float16, "
                "torch.bfloat16, 'float16', 'bfloat16' or 'cbfloat16'."
            )
        value = names[value]
    if value not in _HALF_DTYPES:
        raise CstorchValueError(
            f"Invalid half dtype {value!r}; expected one of "
            f"{sorted(_HALF_DTYPES)} or torch.float16/torch.bfloat16."
        )
    _AmpState.half_dtype_str = value
    _AmpState.mixed_precision = True
    return _HALF_DTYPES[value]


def use_bfloat16(use: bool) -> torch.dtype:
    """The 2.0 spelling of choosing the half dtype: bfloat16 when ``use``, else float16.
    Unlike ``set_half_dtype`` it leaves mixed precision on or off as it was (or to the
    backend's default, when no choice was made)."""
    if not isinstance(use, bool):
        raise CstorchValueError(f"use_bfloat16 expects a bool, got {use!r}.")
    was_mixed = _AmpState.mixed_precision
    dtype = set_half_dtype("bfloat16" if use else "float16")
    _AmpState.mixed_precision = was_mixed
    return dtype


def get_half_dtype() -> torch.dtype:
    return _HALF_DTYPES[_AmpState.half_dtype_str]


def get_half_dtype_str() -> str:
    return _AmpState.half_dtype_str


def get_floating_point_dtype(default: torch.dtype = torch.float32) -> torch.dtype:
    return get_half_dtype() if mixed_precision() else default


def get_floating_point_dtype_str(default: str = "float32") -> str:
    return get_half_dtype_str() if mixed_precision() else default


def is_cbfloat16_tensor(tensor) -> bool:
    return _AmpState.half_dtype_str == "cbfloat16" and getattr(tensor, "dtype", None) == (
        torch.float16
    )


def current_policy() -> Policy:
    """The engine precision policy implied by the current settings (and torch's float32
    matmul precision, which decides whether a GPU may use TF32 for fp32 matmuls)."""
    float32_matmul = torch_float32_matmul()
    if not mixed_precision():
        return Policy(float32_matmul=float32_matmul)
    return Policy(compute_dtype=get_half_dtype_str(), float32_matmul=float32_matmul)
