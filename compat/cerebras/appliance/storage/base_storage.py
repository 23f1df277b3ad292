"""Storage back ends by path: a reader, writer or deleter class is chosen by what a path
looks like (``s3://...`` is S3, anything else a local H5 checkpoint file)."""

from __future__ import annotations

import dataclasses
import os
from abc import ABC, abstractmethod
from typing import Optional


class _Storage(ABC):
    """A storage object bound to one path; subclasses say which paths they handle."""

    def __init__(self, path: str):
        self._path = os.fspath(path)

    @property
    def path(self) -> str:
        return self._path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @classmethod
    @abstractmethod
    def is_valid_path(cls, path: str) -> bool:
        """True when some implementation handles ``path``."""
        return any(sub.is_valid_path(path) for sub in cls._implementations())

    @classmethod
    @abstractmethod
    def path_exists(cls, path: str) -> bool:
        """True when something is stored at ``path``."""
        return cls.get_type(path).path_exists(path)

    @classmethod
    def _implementations(cls):
        found = []
        for sub in cls.__subclasses__():
            if "is_valid_path" in vars(sub) and not getattr(sub, "__abstractmethods__", None):
                found.append(sub)
            found.extend(s for s in sub._implementations() if s not in found)
        return found

    @classmethod
    def get_type(cls, path: str):
        """The implementation class that handles ``path`` (ValueError when none does)."""
        path = os.fspath(path)
        for sub in cls._implementations():
            if sub.is_valid_path(path):
                return sub
        raise ValueError(f"No {cls.__name__} handles the path {path!r}.")

    @classmethod
    def get(cls, path: str, *args, **kwargs):
        """An instance of the implementation that handles ``path``."""
        return cls.get_type(path)(path, *args, **kwargs)


class StorageReader(_Storage):
    @dataclasses.dataclass
    class Stats:
        path: str
        st_mtime: float

    def exists(self) -> bool:
        return self.path_exists(self.path)

    @property
    @abstractmethod
    def stats(self) -> "StorageReader.Stats": ...


class StorageWriter(_Storage):
    @abstractmethod
    def write_numpy(self, key: str, array, metadata: dict): ...

    @abstractmethod
    def write_bytes(self, key: str, data: bytes, metadata: dict): ...


class StorageDeleter(_Storage):
    @abstractmethod
    def delete(self, key: Optional[str] = None) -> bool: ...
