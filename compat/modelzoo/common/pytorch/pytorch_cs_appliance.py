"""``PyTorchCSAppliance``: runs on a Cerebras system in appliance mode (1.8/1.9's CSX
runner) — here the modeled wafer (see ``pytorch_base_cs_runner``)."""

import logging

from modelzoo.common.pytorch.pytorch_base_cs_runner import PyTorchBaseCSRunner


class PyTorchCSAppliance(PyTorchBaseCSRunner):
    """The CSX runner: trains and evaluates on the modeled wafer."""

    def on_train_end(self, early_exit: bool):
        logging.info("Training Completed Successfully!")

    def on_eval_end(self, early_exit: bool):
        logging.info("Evaluation Completed Successfully!")
