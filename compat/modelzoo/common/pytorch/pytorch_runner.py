"""``PyTorchRunner``: the 1.x CPU/GPU runner (``PyTorchRunner(device, model, params)``).

Runs on the cstorch ``CPU`` (or ``GPU``) backend. As in 1.x, ``model.mixed_precision``
only has an effect on a GPU (on CPU it warns and trains in fp32), and the train loss is
divided by ``grad_accum_steps`` so the accumulated loss is the mean over micro-batches.
"""

from __future__ import annotations

import logging
import warnings
from datetime import datetime
from typing import Union

import torch

from modelzoo.common.pytorch.pytorch_base_runner import PyTorchBaseRunner


class PyTorchRunner(PyTorchBaseRunner):
    """Runs a model on CPU or GPU."""

    def __init__(self, device, model, params):
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        if params["model"]["mixed_precision"] and self._device.type != "cuda":
            warnings.warn(
                "Mixed-Precision training is only supported on GPU... Autocast has no effect!"
            )
        self.use_bfloat16 = params["model"].get("use_bfloat16", False)
        super().__init__(model=model, params=params)

    def on_train_end(self, early_exit: bool):
        logging.info("Training Completed Successfully!")

    def on_eval_end(self, early_exit: bool):
        logging.info("Evaluation Completed Successfully!")

    def on_train_batch_start(self, data):
        return self._to_device(data)

    def on_eval_batch_start(self, data):
        return self._to_device(data)

    def train_forward(self, data):
        return super().train_forward(data) / self._grad_accum_steps

    def _increment_global_step(self):
        self._global_step += 1

    def _write_log(self, loss, step):
        logging.info(
            f"| {self._active_mode.title()} Device={self._device.type}, Step={step}, "
            f"Loss={float(loss):.5f}, Time={datetime.now().strftime('%H:%M:%S')}"
        )

    def _save_checkpoint(self, step):
        return self._write_checkpoint(step)

    def _to_device(self, data: Union[dict, list, tuple], non_blocking=False):
        if isinstance(data, torch.Tensor):
            return data.to(self._device)
        if isinstance(data, dict):
            return {
                k: v.to(self._device) if isinstance(v, torch.Tensor) else v for k, v in data.items()
            }
        if isinstance(data, (list, tuple)):
            return type(data)(
                t.to(self._device) if isinstance(t, torch.Tensor) else t for t in data
            )
        raise RuntimeError(
            f"Data should be either a List or Dict of tensors. It was {type(data)} instead."
        )
