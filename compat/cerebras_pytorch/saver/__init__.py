"""``cerebras_pytorch.saver`` (releases 1.7 to 2.1): cstorch's saver package, with the
1.x appliance runner's piecewise checkpoint writing added to its ``PyTorchH5Saver``
(``pt_h5_saver``)."""

from cerebras_pytorch.saver.pt_h5_saver import PyTorchH5Saver

__all__ = ["PyTorchH5Saver"]
