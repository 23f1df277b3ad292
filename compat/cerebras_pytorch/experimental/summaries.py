"""1.8 ``scalar_summary`` / ``save_summaries`` and 1.9 ``summarize_scalar``.

A summary called inside a compiled step records the tensor as a step output; its value
arrives after the step (a step closure) and waits for ``save_summaries(writer, step)``, which
writes every pending value and clears them. ``summarize_scalar`` (1.9) writes straight to the
SummaryWriter of the running ``DataExecutor(writer=...)`` when there is one.
"""

from __future__ import annotations

import torch

from cstorch import config as cstorch_config
from cstorch.utils.step_closures import step_closure

_pending: dict = {}
cstorch_config.config.on_reset(_pending.clear)  # cstorch.config.reset()


@step_closure
def _record(name, value):
    _pending[name] = (
        float(value.float().mean()) if isinstance(value, torch.Tensor) else float(value)
    )


def scalar_summary(name: str, value) -> None:
    """1.8: records a scalar (a 0-dim tensor or number) to write with ``save_summaries``."""
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        raise ValueError(
            f"scalar_summary({name!r}) needs a single-element tensor, got shape "
            f"{tuple(value.shape)}."
        )
    _record(name, value)


def save_summaries(writer, step: int) -> None:
    """1.8: writes the pending summaries to ``writer`` at ``step`` and clears them."""
    for name, value in sorted(_pending.items()):
        writer.add_scalar(name, value, step)
    _pending.clear()


@step_closure
def _write_to_executor(name, value):
    from cstorch.backend import current_backend_impl

    impl = current_backend_impl(raise_exception=False)
    executor = impl.data_executor if impl is not None and impl.data_executor_stack else None
    writer = getattr(executor, "_writer", None)
    if writer is None:
        _pending[name] = float(value)
    else:
        writer.add_scalar(name, float(value), executor.user_iteration)


def summarize_scalar(name: str, value) -> None:
    """1.9: a scalar summary written to the executor's writer at the current step."""
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        raise ValueError(
            f"summarize_scalar({name!r}) needs a single-element tensor, got "
            f"shape {tuple(value.shape)}."
        )
    _write_to_executor(name, value)
