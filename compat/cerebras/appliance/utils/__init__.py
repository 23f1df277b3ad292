"""Utilities of ``cerebras.appliance`` used by the Model Zoo and user scripts.

The Model Zoo's trainer imports this package, so this is where the zoo's needs from the
installed torch are met (``cerebras.appliance.torch_compat``)."""

from cerebras.appliance import torch_compat as _torch_compat

_torch_compat.install()
