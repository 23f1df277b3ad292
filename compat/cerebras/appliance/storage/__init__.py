"""Checkpoint storage by path: local H5 files (this project's format) and recognised-but-
unavailable S3 paths."""

from .base_storage import StorageDeleter, StorageReader, StorageWriter
from .h5_storage import H5Deleter, H5Reader, H5Writer
from .s3_storage import S3Deleter, S3Reader, S3Writer

__all__ = [
    "H5Deleter",
    "H5Reader",
    "H5Writer",
    "S3Deleter",
    "S3Reader",
    "S3Writer",
    "StorageDeleter",
    "StorageReader",
    "StorageWriter",
]
