"""Class helpers."""

from __future__ import annotations

from typing import Callable, Iterator, Optional, Type


def retrieve_all_subclasses(
    cls: Type, condition: Optional[Callable[[Type], bool]] = None
) -> Iterator[Type]:
    """Every subclass of ``cls`` (depth first), optionally only those ``condition`` accepts."""
    for sub in cls.__subclasses__():
        if condition is None or condition(sub):
            yield sub
        yield from retrieve_all_subclasses(sub, condition)
