"""Local checkpoint files in the cerebras-pytorch H5 format (this project's ``cstorch.storage``)."""

from __future__ import annotations

import os
from typing import Optional

from cstorch.storage import h5_format

from .base_storage import StorageDeleter, StorageReader, StorageWriter


def _is_local(path) -> bool:
    return isinstance(path, (str, os.PathLike)) and "://" not in os.fspath(path)


class H5Reader(StorageReader):
    """Reads one checkpoint file: ``keys()``, ``read_numpy(key)``, ``global_metadata``."""

    def __init__(self, path: str):
        super().__init__(path)
        self._reader = h5_format.H5Reader(self.path)

    @classmethod
    def is_valid_path(cls, path) -> bool:
        return _is_local(path)

    @classmethod
    def path_exists(cls, path) -> bool:
        return os.path.exists(path)

    @property
    def stats(self) -> StorageReader.Stats:
        return StorageReader.Stats(self.path, os.stat(self.path).st_mtime)

    @property
    def global_metadata(self) -> dict:
        return self._reader.root_attributes()

    def keys(self) -> list:
        keys = []
        self._reader._file.visititems(
            lambda name, obj: keys.append(name) if hasattr(obj, "shape") else None
        )
        return keys

    def read_numpy(self, key: str):
        return self._reader.read_array(key)

    def close(self) -> None:
        self._reader.close()

    def __exit__(self, *exc):
        self.close()
        return False


class H5Writer(StorageWriter):
    """Writes one checkpoint file atomically: the file appears only on exit without error."""

    def __init__(self, path: str):
        super().__init__(path)
        self._writer = h5_format.H5Writer(self.path)

    @classmethod
    def is_valid_path(cls, path) -> bool:
        return _is_local(path)

    @classmethod
    def path_exists(cls, path) -> bool:
        return os.path.exists(path)

    def write_numpy(self, key: str, array, metadata: dict) -> None:
        self._writer.write_array(key, array, metadata)

    def write_bytes(self, key: str, data: bytes, metadata: dict) -> None:
        self._writer.write_bytes(key, bytes(data), metadata)

    def write_metadata(self, metadata: dict) -> None:
        self._writer.write_root_attributes(metadata)

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self._writer.commit()
        else:
            self._writer.abort()
        return False


class H5Deleter(StorageDeleter):
    @classmethod
    def is_valid_path(cls, path) -> bool:
        return _is_local(path)

    @classmethod
    def path_exists(cls, path) -> bool:
        return os.path.exists(path)

    def delete(self, key: Optional[str] = None) -> bool:
        if key is not None:
            raise ValueError("H5Deleter deletes whole checkpoint files; key must be None.")
        if not os.path.exists(self.path):
            return False
        os.remove(self.path)
        return True
