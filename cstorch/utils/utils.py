"""Small helpers shared by cstorch modules and the Model Zoo: glob parameter filters."""

from __future__ import annotations

import fnmatch
import inspect
import re
from typing import Callable, List, Union

import torch.nn as nn

from jax_backend.errors import CstorchTypeError, CstorchValueError

FilterCallable = Callable[[str, nn.Parameter], bool]


def convert_glob_to_regex(f: str) -> re.Pattern:
    """A compiled regex matching the same names as the glob ``f`` (use ``.fullmatch``)."""
    if not isinstance(f, str):
        raise CstorchTypeError(
            f"A parameter filter must be a glob string or a list of them, got "
            f"{type(f).__name__}: {f!r}."
        )
    return re.compile(fnmatch.translate(f))


def make_param_filter(param_filter: Union[str, List[str], FilterCallable]) -> FilterCallable:
    """``(name, param) -> bool`` from a glob, a list of globs or such a callable itself."""
    if callable(param_filter):
        try:
            inspect.signature(param_filter).bind(None, None)
        except TypeError:
            raise CstorchValueError(
                f"Unknown param_filter {param_filter!r}: expected a glob string, a list of glob "
                f"strings, or a callable taking (name: str, param: nn.Parameter) -> bool."
            ) from None
        return param_filter
    patterns = [param_filter] if isinstance(param_filter, str) else param_filter
    if not isinstance(patterns, (list, tuple)):
        raise CstorchTypeError(
            f"A parameter filter must be a glob string or a list of them, got "
            f"{type(param_filter).__name__}."
        )
    regexes = [convert_glob_to_regex(p) for p in patterns]

    def matches(name: str, param: nn.Parameter) -> bool:
        return any(r.fullmatch(name) for r in regexes)

    return matches
