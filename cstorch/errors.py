"""User-facing exception classes of cstorch (each message says what happened and the fix)."""

from jax_backend.errors import (
    CstorchError,
    CstorchNotImplementedError,
    CstorchRuntimeError,
    CstorchTypeError,
    CstorchValueError,
    LoweringNotFoundError,
    RecompilationError,
    ValueReadInTraceError,
    quoted,  # a message's quote of a string from an untrusted file, kept short
)


class MultipleBackendsError(CstorchError, RuntimeError):
    """A second backend was requested while one already exists."""


class NoBackendError(CstorchError, RuntimeError):
    """An API that needs a backend was used before ``cstorch.backend(...)``."""


__all__ = [
    "CstorchError",
    "CstorchNotImplementedError",
    "CstorchRuntimeError",
    "CstorchTypeError",
    "CstorchValueError",
    "LoweringNotFoundError",
    "MultipleBackendsError",
    "NoBackendError",
    "RecompilationError",
    "ValueReadInTraceError",
    "quoted",
]
