"""``cerebras.pytorch`` is ``cstorch`` (same module objects, submodules included)."""

from cstorch.utils._import_alias import install

install("cerebras.pytorch", "cstorch")
