"""Annotation decorators (``cstorch.pol``, ``cstorch.device_annotation``).

On a Cerebras system an annotation tags the operations traced inside the decorated function
(forward and/or backward) for the compiler. Here the annotations have no effect on the
computed numbers; they are validated, and the innermost active one is readable while the
decorated function runs (``current_annotation``), which is how ``cstorch.current_pol``
works.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from jax_backend.user_frames import warn

_active: dict = {}  # annotation kind -> stack of values in effect


def current_annotation(kind: str, default: Any = None) -> Any:
    """The value of the innermost active ``kind`` annotation, else ``default``."""
    stack = _active.get(kind)
    return stack[-1] if stack else default


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
