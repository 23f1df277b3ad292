"""S3 checkpoint paths (``s3://bucket/key``) are recognised, so code can route on them, but
this implementation has no S3 client: opening one raises, naming the fix."""

from __future__ import annotations

from typing import Optional

from .base_storage import StorageDeleter, StorageReader, StorageWriter


def _is_s3(path) -> bool:
    return isinstance(path, str) and path.startswith("s3://")


def _unavailable(path):
    raise NotImplementedError(
        f"Cannot access {path!r}: S3 checkpoint storage is not available in this "
        "implementation. Save to a local path (or a mounted bucket) instead."
    )


class S3Reader(StorageReader):
    def __init__(self, path: str, *args, **kwargs):
        _unavailable(path)

    @classmethod
    def is_valid_path(cls, path) -> bool:
        return _is_s3(path)

    @classmethod
    def path_exists(cls, path) -> bool:
        _unavailable(path)

    @property
    def stats(self):  # pragma: no cover - never constructed
        raise NotImplementedError


class S3Writer(StorageWriter):
    def __init__(self, path: str, *args, **kwargs):
        _unavailable(path)

    @classmethod
    def is_valid_path(cls, path) -> bool:
        return _is_s3(path)

    @classmethod
    def path_exists(cls, path) -> bool:
        _unavailable(path)

    def write_numpy(self, key, array, metadata):  # pragma: no cover - never constructed
        raise NotImplementedError

    def write_bytes(self, key, data, metadata):  # pragma: no cover - never constructed
        raise NotImplementedError


class S3Deleter(StorageDeleter):
    def __init__(self, path: str, *args, **kwargs):
        _unavailable(path)

    @classmethod
    def is_valid_path(cls, path) -> bool:
        return _is_s3(path)

    @classmethod
    def path_exists(cls, path) -> bool:
        _unavailable(path)

    def delete(self, key: Optional[str] = None) -> bool:  # pragma: no cover
        raise NotImplementedError
