"""``cbtorch.dataloader(loader)``: the 1.x loader whose iterations mark the steps.

Before each batch is handed out (and once after the last), the step just traced is over:
``cm.mark_step()`` runs the step closures queued during it. The batch handed out is also
what the appliance runs the compiled step on (``current_batch``).

The 1.x zoo hands the device int32 labels and token ids (gpt2 asserts they are int32); the
stack's losses took int32 targets, torch's CPU kernels insist on int64. So the batches keep
their int32, and while a batch is out (the runner's eager first iteration and the traced
step included) the classification losses widen an int32 target themselves
(``int32_targets``). Half-precision inputs are widened to float32.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from cerebras_pytorch.lazy import _run, cb_model as _cm


class DataLoader:
    def __init__(self, loader):
        self._loader = loader
        self.current_batch = None

    @property
    def batch_size(self):
        return getattr(self._loader, "batch_size", None)

    def __len__(self):
        return len(self._loader)

    def __iter__(self):
        run = _run.current()
        run.dataloader = self
        run.in_execution_loop = True
        try:
            for batch in self._loader:
                _cm.mark_step()
                batch = _widen(batch)
                self.current_batch = batch
                with int32_targets():
                    yield batch
            _cm.mark_step()
        finally:
            run.in_execution_loop = False

    def __getattr__(self, name):
        if name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)


@contextlib.contextmanager
def int32_targets():
    """``torch.nn.functional.nll_loss``/``cross_entropy`` (which ``nn.NLLLoss`` and
    ``nn.CrossEntropyLoss`` call) widen an int32 target to int64, as the 1.x stack's losses
    accepted int32 targets. (A torch function mode would see every op of the engine's
    capture too; these two names are all that changes.)"""
    originals = {name: getattr(F, name) for name in ("nll_loss", "cross_entropy")}

    def widening(loss):
        @functools.wraps(loss)
        def with_int32_target(input, target, *args, **kwargs):
            return loss(input, target.long() if _is_int32(target) else target, *args, **kwargs)

        return with_int32_target

    for name, loss in originals.items():
        setattr(F, name, widening(loss))
    try:
        yield
    finally:
        for name, loss in originals.items():
            setattr(F, name, loss)


def _is_int32(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.int32


def _widen(data):
    if isinstance(data, torch.Tensor):
        if data.dtype in (torch.float16, torch.bfloat16):
            return data.float()
        return data
    if isinstance(data, dict):
        return type(data)((k, _widen(v)) for k, v in data.items())
    if isinstance(data, (list, tuple)):
        return type(data)(_widen(v) for v in data)
    return data
