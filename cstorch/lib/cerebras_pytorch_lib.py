"""The calls user code makes on the reference's native ``cerebras_pytorch_lib``.

* ``set_attribute(tensor, name, value)`` attaches a compiler attribute to a tensor. Here it is
  recorded on the tensor (``get_attributes(tensor)``) and changes no number.
* ``enable_annotation(name, value)`` / ``disable_annotation(name)`` bracket ops that an
  annotation tags; here they push/pop the value read by ``cstorch.core.annotation.
  current_annotation(name)``.

Anything else the native library offers (lazy-tensor internals) does not exist here:
asking for it raises AttributeError saying so.
"""

from __future__ import annotations

from torch.utils.weak import WeakIdKeyDictionary

from cstorch.core import annotation as _annotation
from jax_backend.errors import CstorchTypeError

_attributes = WeakIdKeyDictionary()  # tensor -> {attribute: value}, by identity


def set_attribute(tensor, attribute: str, value) -> None:
    if not isinstance(attribute, str):
        raise CstorchTypeError(f"attribute must be a str, got {type(attribute).__name__}.")
    _attributes.setdefault(tensor, {})[attribute] = value


def get_attributes(tensor) -> dict:
    """The attributes ``set_attribute`` recorded on ``tensor`` (a copy)."""
    return dict(_attributes.get(tensor, {}))


def enable_annotation(name: str, value) -> None:
    _annotation.push_annotation(name, value)


def disable_annotation(name: str) -> None:
    _annotation.pop_annotation(name)


def __getattr__(name):
    raise AttributeError(
        f"cerebras_pytorch_lib.{name} is part of the reference's native lazy-tensor library, "
        "which this implementation (a JAX engine) does not have."
    )
