"""Annotation decorators (``cstorch.pol``, ``cstorch.device_annotation``).

On a Cerebras system an annotation tags the operations traced inside the decorated function
(forward and/or backward) for the compiler. Here the annotations have no effect on the
computed numbers; they are validated, and the innermost active one is readable while the
decorated function runs (``current_annotation``), which is how ``cstorch.current_pol``
works.
``AnnotationMode`` and ``create_annotation`` build such decorators from a config dataclass
(the form the Model Zoo and ``cstorch.utils.kernel`` / ``num_kv_groups`` use).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

from jax_backend.user_frames import warn

_active: dict = {}  # annotation kind -> stack of values in effect


def current_annotation(kind: str, default: Any = None) -> Any:
    """The value of the innermost active ``kind`` annotation, else ``default``."""
    stack = _active.get(kind)
    return stack[-1] if stack else default


def push_annotation(kind: str, value: Any) -> None:
    """Puts ``value`` in effect for ``kind`` until the matching ``pop_annotation``."""
    _active.setdefault(kind, []).append(value)


def pop_annotation(kind: str) -> None:
    """Ends the innermost ``kind`` annotation, if one is in effect."""
    stack = _active.get(kind)
    if stack:
        stack.pop()


def active_annotations() -> dict:
    """``{kind: [values in effect, innermost last]}`` (a copy)."""
    return {kind: list(stack) for kind, stack in _active.items()}


def annotation(kind: str, value: Any, enable_fwd: bool = True,
               enable_bwd: bool = True) -> Callable:
    """A decorator that puts ``value`` in effect for ``kind`` while the function runs.

    As in the reference, it warns that the annotation has no effect off the CSX backend and,
    with no backend at all, returns the identity decorator.
    """
    from cstorch.backend import current_backend_impl

    impl = current_backend_impl(raise_exception=False)
    if impl is None or not impl.is_csx:
        device = impl.torch_device if impl is not None else None
        warn(f"Setting a {kind!r} annotation for device {device} doesn't have any effect.")
        if impl is None:
            return lambda fn: fn

    def decorator(fn):
        @functools.wraps(fn)
        def annotated(*args, **kwargs):
            stack = _active.setdefault(kind, [])
            stack.append(value if enable_fwd else current_annotation(kind, None))
            try:
                return fn(*args, **kwargs)
            finally:
                stack.pop()

        return annotated

    return decorator


class AnnotationMode:
    """The vocabulary of config-driven annotations (``create_annotation``).

    An annotation is described by a ``Config`` dataclass (subclass ``AnnotationMode.Config``,
    adding its own fields) and a function ``get_attribute(config, is_backward)`` returning the
    ``AnnotationMode.Attribute(name, value)`` that tags the traced operations. Here the attribute
    becomes the innermost value of ``current_annotation(name)`` while the decorated function runs;
    an attribute whose value is None tags nothing.
    """

    @dataclasses.dataclass
    class Config:
        enable_fwd: bool
        enable_bwd: bool

    @dataclasses.dataclass
    class Attribute:
        name: str
        value: Optional[Any]


def create_annotation(annotation_config: type, get_attribute_fn: Callable, **kwargs) -> Callable:
    """A decorator tagging what the decorated function computes with the attribute that
    ``get_attribute_fn(annotation_config(**kwargs), is_backward=False)`` names.

    The config is built (and so validated by its ``__post_init__``) at once. As with the other
    annotations, off the CSX backend it warns that the tag has no effect, and with no backend at
    all the decorator is the identity.
    """
    if not (isinstance(annotation_config, type)
            and issubclass(annotation_config, AnnotationMode.Config)):
        raise TypeError(f"annotation_config must be a subclass of AnnotationMode.Config, got "
                        f"{annotation_config!r}.")
    config = annotation_config(**kwargs)
    attribute = get_attribute_fn(config, is_backward=False)
    if not isinstance(attribute, AnnotationMode.Attribute):
        raise TypeError(f"get_attribute_fn must return an AnnotationMode.Attribute, got "
                        f"{type(attribute).__name__}.")
    if attribute.value is None or not (config.enable_fwd or config.enable_bwd):
        return lambda fn: fn
    return annotation(attribute.name, attribute.value, enable_fwd=config.enable_fwd,
                      enable_bwd=config.enable_bwd)
