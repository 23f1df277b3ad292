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

from cstorch.core.compile import register_trace_fn_post_hook, register_trace_fn_pre_hook

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
        raise ValueError(f"Registering decompositions for device {device!r} is not supported. "
                         f"Supported devices are: {list(DEVICES)}.")
    return device.upper()


def register_decomposition(op: Union[torch._ops.OpOverloadPacket, torch._ops.OpOverload],
                           device: str = "CSX") -> Callable:
    """A decorator registering ``fn`` as the decomposition of ``op`` (an overload, or every
    overload of a packet) on ``device`` ("CSX" or "CPU")."""
    device = _check_device(device)

    def decorator(fn: Callable) -> Callable:
        for overload in _overloads(op):
            if overload in _DENY or overload.overloadpacket in _DENY:
                raise RuntimeError(f"Decomposition for {overload} is not supported.")
            key = (overload, device)
            if key in _decompositions:
                raise RuntimeError(
                    f"A decomposition for {overload} has already been registered on {device}; "
                    f"the first registration was at:\n{_decompositions[key][1]}")
            _decompositions[key] = (fn, "".join(traceback.format_stack()[:-1]))
        return fn

    return decorator


def remove_decomposition(op, device: str = "CSX") -> None:
    """Removes a decomposition registered with ``register_decomposition``."""
    device = _check_device(device)
    for overload in _overloads(op):
        if _decompositions.pop((overload, device), None) is None:
            raise RuntimeError(f"Decomposition for {overload} on {device} has not been "
                               "registered.")


_replaced: dict = {}  # entries of the capture table displaced during the current trace
_MISSING = object()


def _capture_table() -> dict:
    from jax_backend.capture import decompositions

    return decompositions()


def _apply() -> None:
    from cstorch.backend import current_backend_impl

    _restore()
    impl = current_backend_impl(raise_exception=False)
    if impl is None or not _decompositions:
        return
    device = "CSX" if impl.is_csx else "CPU"
    table = _capture_table()
    for (overload, dev), (fn, _) in _decompositions.items():
        if dev == device:
            _replaced.setdefault(overload, table.get(overload, _MISSING))
            table[overload] = fn


def _restore() -> None:
    if not _replaced:
        return
    table = _capture_table()
    for overload, previous in _replaced.items():
        if previous is _MISSING:
            table.pop(overload, None)
        else:
            table[overload] = previous
    _replaced.clear()


register_trace_fn_pre_hook(_apply)
register_trace_fn_post_hook(_restore)
