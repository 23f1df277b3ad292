"""``register_decomposition``: user decompositions of ATen ops used when steps are traced.

A decomposition registered for ``device="CPU"`` applies to steps traced on the CPU and GPU
backends, one for ``device="CSX"`` to the CSX backend. It is merged into the capture's
decomposition table for the duration of each trace (trace pre/post hooks), so registering
after the first trace affects only steps traced afterwards (the reference refuses that).
"""

from __future__ import annotations

import traceback
from typing import Callable, Union

import torch
from torch._decomp import _add_op_to_registry

from jax_backend.errors import CstorchRuntimeError, CstorchValueError

aten = torch.ops.aten

DEVICES = ("CSX", "CPU")
_DENY = {aten.detach, aten.lift, aten.lift_fresh}

_decompositions: dict = {}  # (OpOverload, device) -> (fn, stack text of the registration)


def _overloads(op) -> list:
    table: dict = {}
    _add_op_to_registry(table, op, lambda *a, **k: None)
    return list(table)


def _check_device(device: str) -> str:
    if not isinstance(device, str) or device.upper() not in DEVICES:
        raise CstorchValueError(
            f"Registering decompositions for device {device!r} is not supported. "
            f"Supported devices are: {list(DEVICES)}."
        )
    return device.upper()


def register_decomposition(
    op: Union[torch._ops.OpOverloadPacket, torch._ops.OpOverload], device: str = "CSX"
) -> Callable:
    """A decorator registering ``fn`` as the decomposition of ``op`` (an overload, or every
    overload of a packet) on ``device`` ("CSX" or "CPU")."""
    device = _check_device(device)

    def decorator(fn: Callable) -> Callable:
        for overload in _overloads(op):
            if overload in _DENY or overload.overloadpacket in _DENY:
                raise CstorchRuntimeError(f"Decomposition for {overload} is not supported.")
            key = (overload, device)
            if key in _decompositions:
                raise CstorchRuntimeError(
                    f"A decomposition for {overload} has already been registered on {device}; "
                    f"the first registration was at:\n{_decompositions[key][1]}"
                )
            _decompositions[key] = (fn, "".join(traceback.format_stack()[:-1]))
        return fn

    return decorator


def remove_decomposition(op, device: str = "CSX") -> None:
    """Removes a decomposition registered with ``register_decomposition``."""
    device = _check_device(device)
    for overload in _overloads(op):
        if _decompositions.pop((overload, device), None) is None:
            raise CstorchRuntimeError(
                f"Decomposition for {overload} on {device} has not been registered."
            )


def decompositions_for(device: str) -> dict:
    """``{OpOverload: fn}`` of the decompositions registered for ``device`` ("CSX" or
    "CPU"), for ``jax_backend.capture_step``'s ``decompositions`` argument."""
    return {overload: fn for (overload, dev), (fn, _) in _decompositions.items() if dev == device}
