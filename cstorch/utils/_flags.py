"""``_flags``: the base of the ``cstorch.backends`` flag tree.

Every flag group is a dataclass deriving from ``_flags``. Assigning to a flag checks the name
(unknown → AttributeError), refuses to replace a nested group (AttributeError), checks the
value against the field's annotation (TypeError) and then runs the field's validator, if the
field was declared with ``flag(default, validate=...)`` (ValueError). Assigning ``DEFAULT``
restores the default. A group is also a context manager that restores its values on exit.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Any, Callable, Optional

from jax_backend.errors import CstorchTypeError, CstorchValueError


class _DefaultSentinel:
    def __repr__(self):
        return "DEFAULT"


DEFAULT = _DefaultSentinel()
"""Assign this to a flag to reset it to its default value."""

_VALIDATOR = "cstorch_validate"

change_guard: Optional[Callable[[Any, str], None]] = None
"""Called as ``change_guard(group, name)`` before a flag changes (may raise)."""


def flag(
    default=None,
    *,
    validate: Optional[Callable[[str, Any], Any]] = None,
    default_factory: Optional[Callable[[], Any]] = None,
):
    """A dataclass field for a flag. ``validate(name, value)`` raises ValueError for a bad
    value and returns the value to store (possibly normalized)."""
    metadata = {_VALIDATOR: validate}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _type_name(hint) -> str:
    origin = typing.get_origin(hint)
    if origin is None:
        return getattr(hint, "__name__", repr(hint))
    args = ", ".join(_type_name(a) for a in typing.get_args(hint))
    name = getattr(origin, "__name__", None) or repr(origin).replace("typing.", "")
    return f"{name}[{args}]"


def check_type(value, hint) -> bool:
    """Whether ``value`` matches the type annotation ``hint`` (the subset flags use)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union:
        return any(check_type(value, a) for a in args)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (list, typing.List):
        return isinstance(value, list) and (not args or all(check_type(v, args[0]) for v in value))
    if origin in (dict, typing.Dict):
        return isinstance(value, dict) and (
            not args
            or all(check_type(k, args[0]) and check_type(v, args[1]) for k, v in value.items())
        )
    if hint is type(None) or hint is None:
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _is_group_field(field) -> bool:
    return isinstance(field.type, type) and issubclass(field.type, _flags)


@dataclasses.dataclass(repr=False)
class _flags:
    """Base class of flag groups (see module docstring)."""

    def __setattr__(self, name, value):
        if name.startswith("_"):
            return object.__setattr__(self, name, value)
        field = _fields(type(self)).get(name)
        if field is None:
            raise AttributeError(f"'{type(self).__name__}' has no flag '{name}'")
        if _is_group_field(field) and name in self.__dict__ and self.__dict__[name] is not value:
            raise AttributeError(
                f"{name} is a nested flag and cannot be set directly; set its members "
                f"instead (e.g. `....{name}.<flag> = value`)."
            )
        if value is DEFAULT:
            value = _default_of(field)
        elif not _is_group_field(field):
            if not check_type(value, field.type):
                raise CstorchTypeError(
                    f"Expected {_type_name(field.type)} for `{name}`. Got "
                    f"{type(value).__name__}: {value!r}"
                )
        validate = field.metadata.get(_VALIDATOR)
        if validate is not None:
            value = validate(name, value)
        if change_guard is not None and name in self.__dict__:
            change_guard(self, name)
        object.__setattr__(self, name, value)

    def __iter__(self):
        yield from self.asdict().items()

    def asdict(self) -> dict:
        """A deep copy of the flags as a nested dict."""
        return {
            name: (value.asdict() if isinstance(value, _flags) else copy.deepcopy(value))
            for name, value in ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        }

    def load_flags(self, data) -> None:
        """Sets flags (recursively) from a dict or a flags object of the same class."""
        if isinstance(data, _flags):
            if not isinstance(data, type(self)):
                raise CstorchValueError(
                    f"Expected a {type(self).__name__}, got {type(data).__name__}."
                )
            data = data.asdict()
        if not isinstance(data, dict):
            raise CstorchValueError(f"Expected a dictionary of flags, got {type(data).__name__}.")
        for key, value in data.items():
            current = getattr(self, key, None)
            if isinstance(current, _flags):
                current.load_flags(value)
            else:
                setattr(self, key, copy.deepcopy(value))

    def reset(self, recurse: bool = True) -> None:
        """Restores the default of every flag (of nested groups too if ``recurse``)."""
        for field in dataclasses.fields(self):
            value = self.__dict__.get(field.name)
            if isinstance(value, _flags):
                if recurse:
                    value.reset(recurse)
            else:
                setattr(self, field.name, DEFAULT)

    def __repr__(self):
        def render(values: dict) -> str:
            return (
                "("
                + ", ".join(
                    f"{k}={render(v)}"
                    if isinstance(v, dict) and k in groups.get(id(values), ())
                    else f"{k}={v}"
                    for k, v in values.items()
                )
                + ")"
            )

        groups = {}
        values = self.asdict()

        def mark(obj, vals):
            groups[id(vals)] = {
                f.name for f in dataclasses.fields(obj) if isinstance(getattr(obj, f.name), _flags)
            }
            for name in groups[id(vals)]:
                mark(getattr(obj, name), vals[name])

        mark(self, values)
        return type(self).__name__.lstrip("_") + render(values)

    def __enter__(self):
        self.__dict__.setdefault("_saved", []).append(self.asdict())
        return self

    def __exit__(self, *exc):
        saved = self.__dict__.get("_saved")
        if saved:
            self.load_flags(saved.pop())
        return False


def _fields(cls) -> dict:
    return {f.name: f for f in dataclasses.fields(cls)}


def _default_of(field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return copy.deepcopy(field.default)
