"""``PyTorchBaseCSRunner``: what the runners for a Cerebras system share.

Here a "Cerebras system" is the modeled wafer: cstorch's ``CSX`` backend (mixed precision
always; the step compiles once and may not change). As on 1.x systems:

* the compiled program cannot change, so ``train_and_eval`` (train and eval graphs in one
  run) is refused: run ``--mode train`` and then ``--mode eval`` or ``--mode eval_all``;
* integer inputs are int32 on a system (the Model Zoo data functions make int32 labels when
  ``cm.use_cs()``); torch's losses need int64 indices, so int32 tensors are widened to int64
  before the step.
"""

from __future__ import annotations

import logging
from datetime import datetime

import torch

from modelzoo.common.pytorch.pytorch_base_runner import PyTorchBaseRunner


def _widen_int32(data):
    if isinstance(data, torch.Tensor):
        return data.long() if data.dtype == torch.int32 else data
    if isinstance(data, dict):
        return {k: _widen_int32(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_widen_int32(v) for v in data)
    return data


class PyTorchBaseCSRunner(PyTorchBaseRunner):
    """The base of the CS runners (``PyTorchCSAppliance``, ``PyTorchCSRunner``,
    ``PyTorchCSCompiler``)."""

    def __init__(self, model, params):
        super().__init__(model, params)
        if self._grad_accum_steps > 1 and not self._runconfig.get("use_cs_grad_accum", True):
            raise ValueError(
                "Gradient accumulation was disabled for CS runs "
                "(use_cs_grad_accum: false) but grad_accum_steps > 1."
            )

    def on_train_batch_start(self, data):
        return _widen_int32(data)

    def on_eval_batch_start(self, data):
        return _widen_int32(data)

    def train_and_eval(self, train_dataloader, eval_dataloader):
        raise RuntimeError(
            "train_and_eval is not supported on a Cerebras system (CSX): the compiled program "
            "cannot switch between the training and the evaluation graph within a run. Run "
            "`--mode train`, then `--mode eval_all` (or `--mode eval`) over the checkpoints in "
            "model_dir; or use CPU/GPU, which allow train_and_eval."
        )

    def _increment_global_step(self):
        self._global_step += 1

    def _write_log(self, loss, step):
        logging.info(
            f"| {self._active_mode.title()} Device=CSX, Step={step}, "
            f"Loss={float(loss):.5f}, Time={datetime.now().strftime('%H:%M:%S')}"
        )

    def _save_checkpoint(self, step):
        return self._write_checkpoint(step)
