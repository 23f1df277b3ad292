"""Devices of the cstorch API. On this implementation every device keeps torch tensors on the
host CPU (torch sees ``cpu:0``); where the numbers are computed is decided by the backend's
JAX devices.

Entering a device (``with backend.device:``, where models are built) draws random numbers as
cerebras-pytorch does, so that the same ``torch.manual_seed`` gives the same initial weights
as the reference: every random torch function called without a generator gets a fresh
``torch.Generator`` seeded with ``torch.randint(sys.maxsize, (1,))`` drawn from the default
generator (``FreshGenerators``). Outside a device context randomness is plain torch.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import typing

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from cstorch.backend.backend_type import BackendType

_OPTIONAL_GENERATOR = typing.Optional[torch.Generator]


def _is_generator_type(jit_type) -> bool:
    kind = jit_type.kind()
    if kind == "GeneratorType":
        return True
    if kind == "OptionalType":
        return any(_is_generator_type(t) for t in jit_type.containedTypes())
    return False


def _unfilled(position: int, name: str, args, kwargs) -> bool:
    return (len(args) <= position or args[position] is None) and kwargs.get(name) is None


def _missing_generator_args(func, args, kwargs) -> list:
    """Names of ``func``'s generator arguments that the call leaves empty.

    The ATen schema of the op named like ``func`` is asked first (plain, ``generator`` and
    ``low_generator`` overloads, the first one that has such an argument wins); failing that,
    parameters of ``func``'s Python signature annotated ``torch.Generator`` (or Optional).
    """
    name = getattr(func, "__name__", None)
    if name is None:
        return []
    op_name = f"aten::{name}"
    try:
        overloads = torch._C._jit_get_operation(op_name)[1]
    except RuntimeError:
        overloads = None
    for overload in ("", "generator", "low_generator"):
        if overloads is None or overload not in overloads:
            continue
        schema = torch._C._get_schema(op_name, overload)
        missing = [
            a.name
            for i, a in enumerate(schema.arguments)
            if _is_generator_type(a.type) and _unfilled(i, a.name, args, kwargs)
        ]
        if missing:
            return missing
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return []
    return [
        n
        for i, (n, p) in enumerate(parameters.items())
        if (p.annotation is torch.Generator or p.annotation == _OPTIONAL_GENERATOR)
        and _unfilled(i, n, args, kwargs)
    ]


class FreshGenerators(TorchFunctionMode):
    """Gives each random torch call without a generator a freshly seeded one (module doc)."""

    @staticmethod
    def _generator() -> torch.Generator:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(
            int(
                torch.randint(
                    sys.maxsize, (1,), device="cpu", generator=torch.default_generator
                ).item()
            )
        )
        return generator

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        # These four have no generator in their default schema but draw random numbers: run
        # them as "empty, then fill in place" with a fresh generator.
        if func is torch.rand_like:
            g = self._generator()
            return torch.empty_like(*args, **kwargs).uniform_(0.0, 1.0, generator=g)
        if func is torch.randn_like:
            g = self._generator()
            return torch.empty_like(*args, **kwargs).normal_(0.0, 1.0, generator=g)
        if func is torch.randn:
            g = self._generator()
            return torch.empty(*args, **kwargs).normal_(0.0, 1.0, generator=g)
        if func is torch.randint_like and len(args) in (2, 3):
            g = self._generator()
            source, low, high = (args[0], 0, args[1]) if len(args) == 2 else args
            return torch.empty_like(source, **kwargs).random_(low, high, generator=g)
        for name in _missing_generator_args(func, args, kwargs):
            kwargs[name] = self._generator()
        return func(*args, **kwargs)


class Device(contextlib.ContextDecorator):
    """A cstorch device: its ``torch_device`` is where the user's torch tensors live."""

    def __init__(self, device_type: str):
        self.type = device_type
        self.torch_device = torch.device("cpu", index=0)
        self.artifact_dir = None
        self._depth = 0  # nesting of `with device:`
        self._generators = None

    def __str__(self):
        return self.type

    def __repr__(self):
        return f"device(type='{self.type.lower()}')"

    def move_to_device(self, struct):
        return tree_map(
            lambda x: x.to(self.torch_device) if isinstance(x, torch.Tensor) else x, struct
        )

    def __enter__(self):
        self._depth += 1
        if self._depth == 1:
            self._generators = FreshGenerators()
            self._generators.__enter__()
        return self

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0:
            generators, self._generators = self._generators, None
            generators.__exit__(*exc)
        return False


class CPUDevice(Device):
    def __init__(self):
        super().__init__("CPU")


class GPUDevice(Device):
    def __init__(self, enable_distributed=False, dist_backend="nccl", init_method=None):
        super().__init__("GPU")
        self.enable_distributed = enable_distributed
        self.dist_backend = dist_backend
        self.init_method = init_method


class LazyDevice(Device):
    """The modeled wafer ("CSX")."""

    def __init__(self):
        super().__init__("CSX")

    @property
    def config(self):
        """The initialization settings (``lazy_initialization``, ``drop_data``, ...): the
        2.0/2.1 ``backend.device.config``, now ``cstorch.backends.csx.debug``."""
        from cstorch.backends import backends

        return backends.csx.debug


def device(backend_type, *args, **kwargs) -> Device:
    """Builds a bare device object (it does not create a backend)."""
    backend_type = (
        BackendType.from_str(backend_type) if isinstance(backend_type, str) else (backend_type)
    )
    if backend_type == BackendType.CPU:
        return CPUDevice(*args, **kwargs)
    if backend_type == BackendType.GPU:
        return GPUDevice(*args, **kwargs)
    return LazyDevice(*args, **kwargs)
