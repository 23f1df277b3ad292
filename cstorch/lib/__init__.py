"""``cstorch.lib``: where the reference keeps its compiled extension, ``cerebras_pytorch_lib``.

This implementation has no native extension; ``cerebras_pytorch_lib`` is a small Python module
offering the calls that user and Model Zoo code make on it (see that module).
"""

from cstorch.lib import cerebras_pytorch_lib as cerebras_pytorch_lib
