"""Annotation decorators (``cstorch.pol``, ``cstorch.device_annotation``).

On a Cerebras system an annotation tags the operations traced inside the decorated function
(forward and/or backward) for the compiler. Here the annotations have no effect on the
computed numbers; they are validated, and the innermost active one is readable while the
decorated function runs (``current_annotation``), which is how ``cstorch.current_pol``
works.
``AnnotationMode`` and ``create_annotation`` build such decorators from a config dataclass
(the form the Model Zoo and ``cstorch.utils.kernel`` / ``num_kv_groups`` use); ``annotate``
applies an ``AnnotationMode`` instance (the 2.1-2.4 form, which the 2.4 Model Zoo imports).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any, Callable, Optional

from cstorch import config as cstorch_config
from jax_backend.errors import CstorchTypeError
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


# Read while a step is traced (``cstorch.current_pol``): a part of the graph cache's key.
cstorch_config.config.include_in_graph_key("cstorch annotations", active_annotations)


def annotation(kind: str, value: Any, enable_fwd: bool = True, enable_bwd: bool = True) -> Callable:
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


class AnnotationMode(abc.ABC):
    """The vocabulary of config-driven annotations (``create_annotation``, ``annotate``).

    An annotation is described by a ``Config`` dataclass (subclass ``AnnotationMode.Config``,
    adding its own fields) and a function ``get_attribute(config, is_backward)`` returning the
    ``AnnotationMode.Attribute(name, value)`` that tags the traced operations. Here the attribute
    becomes the innermost value of ``current_annotation(name)`` while the decorated function runs;
    an attribute whose value is None tags nothing.

    The older form (cerebras-pytorch 2.1 to 2.4; the 2.4 Model Zoo's ``named_matmul``): a
    subclass defines a class-wide ``config`` property and the method ``get_attribute``, an
    instance is made with its config, and ``annotate(instance)`` applies it. Entering an
    instance makes its config the class-wide one (nested annotations see the innermost) and
    puts its attribute in effect (None where ``enable_fwd`` is off); leaving restores both.
    """

    @dataclasses.dataclass
    class Config:
        enable_fwd: bool
        enable_bwd: bool

    @dataclasses.dataclass
    class Attribute:
        name: str
        value: Optional[Any]

    def __init__(self, config: "AnnotationMode.Config"):
        if not isinstance(config, AnnotationMode.Config):
            raise CstorchTypeError(
                f"{type(self).__name__} takes an AnnotationMode.Config instance, "
                f"got {type(config).__name__}."
            )
        self.local_config = config
        self._entered: list = []  # per nesting level: (the config before, attribute name)

    @property
    @abc.abstractmethod
    def config(self) -> Optional["AnnotationMode.Config"]:
        """The class-wide config in effect (None outside every annotation of this kind)."""

    @config.setter
    @abc.abstractmethod
    def config(self, config: Optional["AnnotationMode.Config"]) -> None: ...

    @abc.abstractmethod
    def get_attribute(
        self, config: "AnnotationMode.Config", is_backward: bool
    ) -> "AnnotationMode.Attribute":
        """The attribute ``config`` tags operations with."""

    def __enter__(self):
        previous = self.config
        self.config = self.local_config
        try:
            attribute = _checked_attribute(
                self.get_attribute(self.local_config, is_backward=False),
                f"{type(self).__name__}.get_attribute",
            )
        except TypeError:
            self.config = previous
            raise
        push_annotation(attribute.name, attribute.value if self.local_config.enable_fwd else None)
        self._entered.append((previous, attribute.name))
        return self

    def __exit__(self, *exc_info) -> None:
        previous, name = self._entered.pop()
        pop_annotation(name)
        self.config = previous


def annotate(annotation_mode: AnnotationMode) -> Callable:
    """A decorator running the decorated function inside ``annotation_mode`` (the 2.1-2.4
    form of ``create_annotation``). As in the reference it needs a backend, and warns that
    the annotation has no effect off the CSX backend."""
    from cstorch.backend import current_backend_impl

    if not isinstance(annotation_mode, AnnotationMode):
        raise CstorchTypeError(
            f"annotate takes an AnnotationMode instance, got {type(annotation_mode).__name__}."
        )
    impl = current_backend_impl()
    if not impl.is_csx:
        warn(
            f"Setting {type(annotation_mode).__name__} for device {impl.torch_device} "
            "doesn't have any effect."
        )

    def decorator(fn):
        @functools.wraps(fn)
        def annotated(*args, **kwargs):
            with annotation_mode:
                return fn(*args, **kwargs)

        return annotated

    return decorator


def _checked_attribute(attribute, source: str) -> "AnnotationMode.Attribute":
    if not isinstance(attribute, AnnotationMode.Attribute):
        raise CstorchTypeError(
            f"{source} must return an AnnotationMode.Attribute, got {type(attribute).__name__}."
        )
    return attribute


def create_annotation(annotation_config: type, get_attribute_fn: Callable, **kwargs) -> Callable:
    """A decorator tagging what the decorated function computes with the attribute that
    ``get_attribute_fn(annotation_config(**kwargs), is_backward=False)`` names.

    The config is built (and so validated by its ``__post_init__``) at once. As with the other
    annotations, off the CSX backend it warns that the tag has no effect, and with no backend at
    all the decorator is the identity.
    """
    if not (
        isinstance(annotation_config, type) and issubclass(annotation_config, AnnotationMode.Config)
    ):
        raise CstorchTypeError(
            f"annotation_config must be a subclass of AnnotationMode.Config, got "
            f"{annotation_config!r}."
        )
    config = annotation_config(**kwargs)
    attribute = _checked_attribute(get_attribute_fn(config, is_backward=False), "get_attribute_fn")
    if attribute.value is None or not (config.enable_fwd or config.enable_bwd):
        return lambda fn: fn
    return annotation(
        attribute.name, attribute.value, enable_fwd=config.enable_fwd, enable_bwd=config.enable_bwd
    )
