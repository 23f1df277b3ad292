"""``cbtorch.dataloader(loader)``: the 1.x loader whose iterations mark the steps.

Before each batch is handed out (and once after the last), the step just traced is over:
``cm.mark_step()`` runs the step closures queued during it. The batch handed out is also
what the appliance runs the compiled step on (``current_batch``).
"""

from __future__ import annotations

import torch

from cerebras_pytorch.lazy import _run
from cerebras_pytorch.lazy import cb_model as _cm


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
                yield batch
            _cm.mark_step()
        finally:
            run.in_execution_loop = False

    def __getattr__(self, name):
        if name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)


def _widen(data):
    if isinstance(data, torch.Tensor):
        if data.dtype == torch.int32:
            return data.long()
        if data.dtype in (torch.float16, torch.bfloat16):
            return data.float()
        return data
    if isinstance(data, dict):
        return type(data)((k, _widen(v)) for k, v in data.items())
    if isinstance(data, (list, tuple)):
        return type(data)(_widen(v) for v in data)
    return data
