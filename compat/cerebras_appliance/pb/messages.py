"""``Message``: a protobuf-like record with declared fields and defaults.

Reading an unset message-typed field gives a fresh default message (as protobuf does), so
``debug_args.debug_ini.frozen_content += "..."`` works on a new ``DebugArgs()``. Unknown field
names raise ``AttributeError`` naming the known ones, as a protobuf message would.
"""

from __future__ import annotations

import copy


class Message:
    # field name -> default value, or a Message subclass for a nested message
    FIELDS: dict = {}

    def __init__(self, **fields):
        for name, value in fields.items():
            setattr(self, name, value)

    def _check(self, name):
        if name not in type(self).FIELDS:
            raise AttributeError(
                f"{type(self).__name__} has no field {name!r}; its fields are "
                f"{sorted(type(self).FIELDS)}."
            )

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        self._check(name)
        default = type(self).FIELDS[name]
        value = default() if isinstance(default, type) else copy.copy(default)
        object.__setattr__(self, name, value)
        return value

    def __setattr__(self, name, value):
        self._check(name)
        object.__setattr__(self, name, value)

    def HasField(self, name) -> bool:
        self._check(name)
        return name in self.__dict__

    def CopyFrom(self, other: "Message") -> None:
        if type(other) is not type(self):
            raise TypeError(
                f"CopyFrom expects a {type(self).__name__}, got {type(other).__name__}."
            )
        self.__dict__.clear()
        self.__dict__.update(copy.deepcopy(other.__dict__))

    def __eq__(self, other):
        return type(other) is type(self) and self.__dict__ == other.__dict__

    def __repr__(self):
        body = ", ".join(f"{k}={v!r}" for k, v in sorted(self.__dict__.items()))
        return f"{type(self).__name__}({body})"


class Enum:
    """A protobuf enum's namespace: ``Name(value)`` and ``Value(name)`` as in protobuf."""

    VALUES: dict = {}

    @classmethod
    def Name(cls, value) -> str:
        for name, v in cls.VALUES.items():
            if v == value:
                return name
        raise ValueError(f"{cls.__name__} has no value {value!r}.")

    @classmethod
    def Value(cls, name) -> int:
        if name not in cls.VALUES:
            raise ValueError(f"{cls.__name__} has no name {name!r}; known: {sorted(cls.VALUES)}.")
        return cls.VALUES[name]

    @classmethod
    def keys(cls):
        return list(cls.VALUES)

    @classmethod
    def values(cls):
        return list(cls.VALUES.values())
