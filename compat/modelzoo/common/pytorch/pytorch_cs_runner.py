"""``PyTorchCSRunner``: the 1.6/1.7 runner for a Cerebras system in pipeline mode. The
pipeline execution strategy runs on the modeled wafer like the appliance runner."""

from modelzoo.common.pytorch.pytorch_cs_appliance import PyTorchCSAppliance


class PyTorchCSRunner(PyTorchCSAppliance):
    """The 1.6/1.7 pipeline-mode CS runner (same behaviour as ``PyTorchCSAppliance``)."""
