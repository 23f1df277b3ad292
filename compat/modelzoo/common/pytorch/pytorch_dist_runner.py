"""``PyTorchDistRunner``: 1.x multi-GPU data parallel (``runconfig.enable_distributed``).

1.x spawned one process per GPU around a DistributedDataParallel model. Here one process
drives the run on the cstorch ``GPU`` backend (which today places the step on one JAX GPU
device; a multi-device data-parallel mesh for it is not built yet). The 1.x interface is
kept: ``train``/``evaluate``/``train_and_eval`` take data *functions* of the params, and
``on_process_start(all_metrics)`` runs before the work starts.
"""

from __future__ import annotations

import torch

from modelzoo.common.pytorch.pytorch_runner import PyTorchRunner


class PyTorchDistRunner(PyTorchRunner):
    """Data-parallel training on all local GPUs (one process)."""

    def __init__(self, model, params):
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        super().__init__(device, model, params)
        self.all_metrics = {}

    def on_process_start(self, all_metrics):
        """Runs before training/evaluation starts (1.x: in each spawned process)."""

    def train(self, train_data_fn):
        self.on_process_start(self.all_metrics)
        return super().train(train_data_fn(self._params))

    def evaluate(self, eval_data_fn):
        self.on_process_start(self.all_metrics)
        return super().evaluate(eval_data_fn(self._params))

    def train_and_eval(self, train_data_fn, eval_data_fn):
        self.on_process_start(self.all_metrics)
        return super().train_and_eval(train_data_fn(self._params), eval_data_fn(self._params))
