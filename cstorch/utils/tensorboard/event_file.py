"""Reading TensorBoard event files, with the ``tensorboard`` package's own message types and
checksum.

An event file is a sequence of TFRecords, each holding one serialized ``tensorflow.Event``
protobuf: ``uint64 length | uint32 masked_crc32c(length) | data | uint32
masked_crc32c(data)``, little endian, with CRC-32C (Castagnoli). The events are tensorboard's
``event_pb2.Event`` and the checksum is its ``masked_crc32c``; only the framing is read here,
from the descriptor ``open_regular_file`` gives: tensorboard's own record reader opens the
path itself (a FIFO planted there would block it) and fails on the truncated tail of a file
that is still being written, where this reader stops.
"""

from __future__ import annotations

import os
import struct
from typing import Iterator

from google.protobuf.message import DecodeError
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from jax_backend.errors import CstorchValueError
from jax_backend.regular_files import open_regular_file


def read_records(path: str) -> Iterator[bytes]:
    """The records of a file; stops at a truncated tail (a file still being written). A
    FIFO or device is refused unopened (``NotARegularFileError``); a record longer than
    what is left of the file is a truncated tail, not a read of that many bytes."""
    with open_regular_file(path, "event file") as f:
        while True:
            header = f.read(12)
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            (header_crc,) = struct.unpack("<I", header[8:])
            if header_crc != masked_crc32c(header[:8]):
                raise CstorchValueError(f"Corrupt record header in event file {path}.")
            if length > os.fstat(f.fileno()).st_size - f.tell():
                return
            data = f.read(length)
            footer = f.read(4)
            if len(data) < length or len(footer) < 4:
                return
            if struct.unpack("<I", footer)[0] != masked_crc32c(data):
                raise CstorchValueError(f"Corrupt record data in event file {path}.")
            yield data


def read_events(path: str) -> Iterator[Event]:
    """The events of a file (``tensorboard.compat.proto.event_pb2.Event``), as
    ``read_records`` reads it; a record that is not an event raises ValueError."""
    for record in read_records(path):
        try:
            yield Event.FromString(record)
        except DecodeError as error:
            raise CstorchValueError(f"Corrupt event in event file {path}: {error}") from None
