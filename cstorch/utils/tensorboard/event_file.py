"""TensorBoard event files without the ``tensorboard`` package.

An event file is a sequence of TFRecords, each holding one serialized ``tensorflow.Event``
protobuf. This module encodes and decodes the few messages that scalar and text summaries
need (Event, Summary, Summary.Value, SummaryMetadata, TensorProto), by hand, so that writing
and reading summaries needs nothing beyond the standard library.

Record layout: ``uint64 length | uint32 masked_crc32c(length) | data | uint32
masked_crc32c(data)``, little endian, with CRC-32C (Castagnoli).
"""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Iterator, List, Optional

from jax_backend.regular_files import open_regular_file

# ------------------------------------------------------------------------------ CRC-32C
_CRC_TABLE = []
for _byte in range(256):
    _crc = _byte
    for _ in range(8):
        _crc = (_crc >> 1) ^ 0x82F63B78 if _crc & 1 else _crc >> 1
    _CRC_TABLE.append(_crc)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def encode_record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", masked_crc32c(header)) + data
            + struct.pack("<I", masked_crc32c(data)))


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
                raise ValueError(f"Corrupt record header in event file {path}.")
            if length > os.fstat(f.fileno()).st_size - f.tell():
                return
            data = f.read(length)
            footer = f.read(4)
            if len(data) < length or len(footer) < 4:
                return
            if struct.unpack("<I", footer)[0] != masked_crc32c(data):
                raise ValueError(f"Corrupt record data in event file {path}.")
            yield data


# ------------------------------------------------------------------------------ protobuf
def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _bytes_field(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _parse(data: bytes) -> dict:
    """Field number -> list of raw values (ints for varint/fixed, bytes for length-delimited)."""
    fields: dict = {}
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 2:
            length, i = _read_varint(data, i)
            value, i = data[i:i + length], i + length
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"Unsupported protobuf wire type {wire}.")
        fields.setdefault(field, []).append(value)
    return fields


def _read_varint(data: bytes, i: int):
    shift = result = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i
        shift += 7


DT_STRING = 7


@dataclasses.dataclass
class Value:
    """A ``Summary.Value``: a scalar (``simple_value``) or a string tensor (text)."""

    tag: str
    simple_value: Optional[float] = None
    strings: Optional[List[bytes]] = None
    plugin_name: Optional[str] = None

    def encode(self) -> bytes:
        out = _bytes_field(1, self.tag.encode())
        if self.simple_value is not None:
            out += _key(2, 5) + struct.pack("<f", self.simple_value)
        if self.strings is not None:
            shape = _bytes_field(2, _bytes_field(2, _key(1, 0) + _varint(len(self.strings))))
            tensor = _key(1, 0) + _varint(DT_STRING) + shape + b"".join(
                _bytes_field(8, s) for s in self.strings)
            out += _bytes_field(8, tensor)
        if self.plugin_name is not None:
            out += _bytes_field(9, _bytes_field(1, _bytes_field(1, self.plugin_name.encode())))
        return out

    @staticmethod
    def decode(data: bytes) -> "Value":
        fields = _parse(data)
        value = Value(tag=fields.get(1, [b""])[0].decode())
        if 2 in fields:
            value.simple_value = struct.unpack("<f", fields[2][0])[0]
        if 8 in fields:
            tensor = _parse(fields[8][0])
            value.strings = list(tensor.get(8, []))
            if 5 in tensor and value.simple_value is None:  # float_val (a tensor scalar)
                raw = tensor[5][0]
                value.simple_value = (struct.unpack("<f", raw)[0] if len(raw) == 4
                                      else struct.unpack(f"<{len(raw) // 4}f", raw)[0])
        if 9 in fields:
            plugin = _parse(fields[9][0]).get(1)
            if plugin:
                value.plugin_name = _parse(plugin[0]).get(1, [b""])[0].decode()
        return value


@dataclasses.dataclass
class Event:
    """A ``tensorflow.Event``: wall time, step and either a file version or summary values."""

    wall_time: float
    step: int = 0
    file_version: Optional[str] = None
    values: List[Value] = dataclasses.field(default_factory=list)

    def encode(self) -> bytes:
        out = _key(1, 1) + struct.pack("<d", self.wall_time)
        if self.step:
            out += _key(2, 0) + _varint(self.step)
        if self.file_version is not None:
            out += _bytes_field(3, self.file_version.encode())
        if self.values:
            out += _bytes_field(5, b"".join(_bytes_field(1, v.encode()) for v in self.values))
        return out

    @staticmethod
    def decode(data: bytes) -> "Event":
        fields = _parse(data)
        step = fields.get(2, [0])[0]
        if step >= 1 << 63:
            step -= 1 << 64
        event = Event(wall_time=struct.unpack("<d", fields[1][0])[0] if 1 in fields else 0.0,
                      step=step)
        if 3 in fields:
            event.file_version = fields[3][0].decode()
        if 5 in fields:
            event.values = [Value.decode(v) for v in _parse(fields[5][0]).get(1, [])]
        return event
