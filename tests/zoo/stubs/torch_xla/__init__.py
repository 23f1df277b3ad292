"""A stand-in for PyTorch/XLA (``torch_xla``) used only by the 1.x Model Zoo check.

Releases 1.6 and 1.7 of the Cerebras stack ran on PyTorch/XLA, and the 1.6 zoo imports two
pieces of it directly: ``torch_xla.utils.utils.SampleGenerator`` (fc_mnist's fake data on a
Cerebras system) and ``torch_xla._XLAC._xla_set_parameter_name`` (naming the state tensors
before an eval is traced). This engine is not built on XLA's torch integration, so the check
provides those two: a generator that yields the same sample ``sample_count`` times (what
PyTorch/XLA's does) and a parameter-naming call with nothing to name.
"""

from . import _XLAC, utils  # noqa: F401

__version__ = "0.0+zoo-check-stand-in"
