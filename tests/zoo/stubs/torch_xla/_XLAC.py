"""``torch_xla._XLAC``: only the parameter-naming call the 1.6 zoo makes (see the package)."""


def _xla_set_parameter_name(tensor, name):
    """Names a tensor in XLA's graph; the engine names its state by path itself."""
