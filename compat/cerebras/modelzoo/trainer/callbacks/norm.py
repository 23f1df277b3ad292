"""Logs the global norms of the parameters and of the gradients every step."""

from __future__ import annotations

import torch

from cerebras.modelzoo.trainer.callbacks.callback import Callback


def _global_norm(tensors) -> torch.Tensor:
    squares = [torch.sum(t.float() ** 2) for t in tensors]
    return torch.sqrt(torch.stack(squares).sum()) if squares else torch.tensor(0.0)


class ComputeNorm(Callback):
    """``model_wise_params_norm`` (before backward) and ``model_wise_grad_norm`` (after it),
    computed inside the compiled step and logged with each step's values."""

    def on_before_backward(self, trainer, model, outputs):
        params = [p for p in model.parameters() if p.requires_grad]
        trainer.log_metrics(model_wise_params_norm=_global_norm(params))

    def on_after_backward(self, trainer, model, outputs):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        trainer.log_metrics(model_wise_grad_norm=_global_norm(grads))
