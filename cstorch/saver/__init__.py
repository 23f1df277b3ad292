"""``cstorch.saver`` (``cerebras.pytorch.saver``): the checkpoint saver class of releases 2.0
to 2.2, which their Model Zoo imports. Checkpoints are read and written by
``cstorch.save``/``cstorch.load`` (``cstorch.storage``); ``PyTorchH5Saver`` is that format's
older object interface."""

from cstorch.saver.pt_h5_saver import PyTorchH5Saver

__all__ = ["PyTorchH5Saver"]
