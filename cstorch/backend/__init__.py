"""The cstorch backend: one per process, CPU, GPU or CSX (the modeled wafer).

``cstorch.backend("cpu")`` creates it; ``cstorch.backend()`` returns it (or None). The
implementation object (``current_backend_impl()``) owns everything that outlives a step:
compiled models, optimizers, schedulers, their device-resident state, the step-closure queue
and the stack of running data executors.
"""

from __future__ import annotations

import inspect
import warnings

import torch

from cstorch import config
from cstorch.backend import old_keywords
from cstorch.backend.backend_type import BackendType
from cstorch.errors import MultipleBackendsError, NoBackendError
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError

_current = None  # the one Backend of this process


class _OneBackend(type):
    """Creating a second backend of any type raises, as in cerebras-pytorch; except that the
    first explicit backend of the type of an implicit one (``cstorch.compile`` before any
    ``cstorch.backend``) adopts it."""

    def __call__(cls, backend_type, *args, **kwargs):
        if _current is not None:
            if getattr(_current, "_implicit_at", None) is not None:
                return _adopt(backend_type, args, kwargs)
            raise MultipleBackendsError(
                f"Cannot instantiate multiple backends. A backend with type "
                f"{_current.backend_type.name} already exists. Use `cstorch.backend()` to get "
                "the existing backend instead of creating a new one."
            )
        return super().__call__(backend_type, *args, **kwargs)


# What the first explicit cstorch.backend call may still set on an implicit backend.
_ADOPTABLE = ("artifact_dir", "engine")


def _adopt(backend_type, args, kwargs) -> "Backend":
    """The implicit backend (made by ``cstorch.compile`` with default settings) becomes the
    one the user asks for, if it is of that type and the settings asked for can still be
    given to it; otherwise a MultipleBackendsError that says where it was made."""
    from cstorch.core.engine import resolve_engine

    if isinstance(backend_type, str):
        backend_type = BackendType.from_str(backend_type)
    if served_type(backend_type) != backend_type:  # a tool serves it (config.serve_backend)
        backend_type, args, kwargs = served_type(backend_type), (), {}
    where = _current._implicit_at
    fix = (
        "A process has one backend: call cstorch.backend(...) before the first "
        "cstorch.compile, or pass the backend to it: cstorch.compile(model, backend)."
    )
    made = (
        f"cstorch.compile, called before any cstorch.backend, created a "
        f"{_current.backend_type.name} backend with default settings at\n{where}\n"
    )
    if backend_type != _current.backend_type:
        raise MultipleBackendsError(f"Cannot create a {backend_type.name} backend: {made}{fix}")
    try:
        settings = (
            inspect.signature(type(_current._impl).__init__)
            .bind(None, backend_type, *args, **kwargs)
            .arguments
        )
    except TypeError as error:
        raise CstorchTypeError(f"cstorch.backend({backend_type.name!r}, ...): {error}") from None
    settings = {k: v for k, v in settings.items() if k not in ("self", "backend_type")}
    refused = sorted(k for k in settings if k not in _ADOPTABLE)
    if "engine" in settings and resolve_engine(settings["engine"]) != _current._impl.engine:
        refused.append("engine")
    if refused:
        raise MultipleBackendsError(
            f"Cannot apply {', '.join(refused)} to the {backend_type.name} backend: {made}{fix}"
        )
    if settings.get("artifact_dir") is not None:
        _current.artifact_dir = settings["artifact_dir"]
    _current._implicit_at = None
    return _current


def served_type(backend_type: BackendType) -> BackendType:
    """The type of backend that serves a request for ``backend_type``: itself, unless a tool
    chose one for every request (``cstorch.config.serve_backend``)."""
    served = config.serve_backend.value
    return backend_type if served is None else BackendType.from_str(served)


def _serving(backend_type: BackendType, args, kwargs):
    """``(type, args, kwargs)`` of the backend that serves a request: the request itself, or
    the type ``config.serve_backend`` names with only the request's ``artifact_dir`` (the
    other settings belong to the type the script named)."""
    served = served_type(backend_type)
    if served == backend_type and config.serve_backend.value is None:
        return backend_type, args, kwargs
    try:
        settings = (
            inspect.signature(_impl_class(backend_type).__init__)
            .bind(None, backend_type, *args, **kwargs)
            .arguments
        )
    except TypeError as error:
        raise CstorchTypeError(f"cstorch.backend({backend_type.name!r}, ...): {error}") from None
    return served, (), {k: v for k, v in settings.items() if k == "artifact_dir"}


def _impl_class(backend_type: BackendType):
    if backend_type.is_cpu:
        from cstorch.backend.cpu_backend import CpuBackendImpl

        return CpuBackendImpl
    if backend_type.is_gpu:
        from cstorch.backend.gpu_backend import GpuBackendImpl

        return GpuBackendImpl
    from cstorch.backend.ltc_backend import PyTorchLtcBackendImpl

    return PyTorchLtcBackendImpl


class Backend(metaclass=_OneBackend):
    """The public face of the backend; the work is done by ``self._impl``."""

    def __init__(self, backend_type: BackendType, *args, **kwargs):
        global _current
        if isinstance(backend_type, str):
            backend_type = BackendType.from_str(backend_type)
        kwargs, max_checkpoints = old_keywords.apply(backend_type, kwargs)
        backend_type, args, kwargs = _serving(backend_type, args, kwargs)
        self.backend_type = backend_type
        self._impl = _impl_class(backend_type)(backend_type, *args, **kwargs)
        self._impl.checkpoint_keeper = old_keywords.CheckpointKeeper(max_checkpoints)
        self._impl.hold_compilation_cache()  # once built: a failed backend holds nothing
        self._implicit_at = None  # where cstorch.compile created it, if it did (implicit_cpu)
        _current = self

    @property
    def artifact_dir(self):
        return self._impl.artifact_dir

    @artifact_dir.setter
    def artifact_dir(self, value):
        self._impl.artifact_dir = value

    @property
    def device(self):
        return self._impl.device

    @property
    def engine(self) -> str:
        """``"jax"`` or ``"eager"`` (see ``cstorch.core.engine``)."""
        return self._impl.engine

    @property
    def torch_device(self) -> torch.device:
        return self._impl.torch_device

    @property
    def is_tracing(self) -> bool:
        return self._impl.is_tracing

    @property
    def is_e2e_execution(self) -> bool:
        return self._impl.is_e2e_execution

    @property
    def cluster(self):
        return getattr(self._impl, "cluster", None)

    @property
    def appliance(self):
        return getattr(self._impl, "appliance", None)

    @property
    def cluster_config(self):
        return getattr(self._impl, "cluster_config", None)

    @property
    def is_cpu(self) -> bool:
        return self.backend_type.is_cpu

    @property
    def is_gpu(self) -> bool:
        return self.backend_type.is_gpu

    @property
    def is_csx(self) -> bool:
        return self.backend_type.is_csx

    def to_cpu(self, tensor):
        return self._impl.to_cpu(tensor)

    def __repr__(self):
        return f"Backend(type={self.backend_type.name})"


def backend(backend_type=None, *args, **kwargs):
    """Creates the backend (``backend("cpu", artifact_dir=...)``) or returns the current one."""
    if backend_type is None:
        if args or kwargs:
            raise CstorchTypeError(
                "cstorch.backend() got arguments but no backend type. Pass the type first, "
                'e.g. cstorch.backend("CPU", artifact_dir=...).'
            )
        return _current
    if isinstance(backend_type, str):
        backend_type = BackendType.from_str(backend_type)
    elif not isinstance(backend_type, BackendType):
        raise CstorchTypeError(
            f"Expected backend_type to be a string or a BackendType, got "
            f"{type(backend_type).__name__}."
        )
    return Backend(backend_type, *args, **kwargs)


# The function doubles as the namespace ``cstorch.backend.Backend`` etc., as in the reference.
backend.Backend = Backend
backend.BackendType = BackendType


def current_backend(raise_exception: bool = True, raise_warning: bool = True):
    """Deprecated: use ``cstorch.backend()``."""
    if raise_warning:
        warnings.warn(
            "cstorch.current_backend() is deprecated; use cstorch.backend() instead.",
            DeprecationWarning,
            stacklevel=2,
        )
    if _current is None and raise_exception:
        raise NoBackendError(
            'No active Cerebras backend found. Create one first with cstorch.backend("CPU") '
            '(or "GPU", "CSX").'
        )
    return _current


def current_backend_impl(raise_exception: bool = True):
    if _current is None:
        if raise_exception:
            raise NoBackendError(
                "No active Cerebras backend found. Create one first with "
                'cstorch.backend("CPU") (or "GPU", "CSX").'
            )
        return None
    return _current._impl


def current_torch_device() -> torch.device:
    """The torch device of the current backend's tensors (``cpu`` when there is none)."""
    if _current is None:
        return torch.device("cpu")
    return _current.torch_device


def use_cs() -> bool:
    """Whether the current backend is the (modeled) Cerebras system, ``CSX``."""
    return _current is not None and _current.is_csx


def implicit_cpu_backend() -> Backend:
    """The CPU backend ``cstorch.compile`` creates when none exists, remembering the user's
    line that made it: the first explicit ``cstorch.backend("CPU")`` adopts it, and one of
    another type names that line."""
    from jax_backend.user_frames import current_user_frame

    created = backend(BackendType.CPU)
    created._implicit_at = current_user_frame() or "  (unknown location)"
    return created


def get_or_create(backend_type, *args, mismatch=None, **kwargs) -> Backend:
    """The process's backend when it is of ``backend_type``; with none yet, a new one
    (``backend(backend_type, *args, **kwargs)``; the arguments only shape a new backend). A
    backend of another type raises ``mismatch(existing)`` (default: a RuntimeError saying so),
    since a process has one backend. The compatibility APIs all get their backend here."""
    if isinstance(backend_type, str):
        backend_type = BackendType.from_str(backend_type)
    if _current is None:
        return backend(backend_type, *args, **kwargs)
    if _current.backend_type != served_type(backend_type):
        if mismatch is not None:
            raise mismatch(_current)
        raise CstorchRuntimeError(
            f"A {_current.backend_type.name} backend already exists in this process; a "
            f"{backend_type.name} backend needs its own process."
        )
    return _current


def get_backend_args(backend_type):
    if isinstance(backend_type, str):
        backend_type = BackendType.from_str(backend_type)
    return inspect.signature(_impl_class(backend_type).__init__).parameters


def _reset_for_tests():
    """Tears the process backend down. Only for test isolation; scripts cannot do this."""
    global _current
    if _current is not None:
        _current._impl.shutdown()
    _current = None


config.config.on_reset(_reset_for_tests)

for _name in (
    "current_backend",
    "current_backend_impl",
    "current_torch_device",
    "use_cs",
    "get_backend_args",
    "implicit_cpu_backend",
    "_reset_for_tests",
):
    setattr(backend, _name, globals()[_name])
