"""A minimal reader and writer of the safetensors format, for when the package is not installed.

Layout: an 8-byte little-endian header length ``N``, ``N`` bytes of JSON, then the raw
little-endian tensor bytes. The header maps each tensor name to
``{"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}`` (offsets relative to the end
of the header) and may hold ``"__metadata__"``: a flat ``{str: str}`` dict. Only data is read:
nothing in a safetensors file can run code.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import torch

from cstorch.storage.conversions import numpy_view
from jax_backend.errors import CstorchError, CstorchValueError, quoted
from jax_backend.regular_files import open_regular_file

_DTYPES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.uint16: "U16",
    torch.int32: "I32",
    torch.uint32: "U32",
    torch.int64: "I64",
    torch.uint64: "U64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
}
_FROM_NAME = {name: dtype for dtype, name in _DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024  # the limit the safetensors library enforces too


class SafetensorsError(CstorchError, RuntimeError):
    """A file that claims to be safetensors is malformed."""


def looks_like_safetensors(path: str | os.PathLike) -> bool:
    """True if the file starts with a plausible header length followed by a JSON object."""
    try:
        with open_regular_file(path, "checkpoint") as f:
            head = f.read(9)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    if len(head) < 9:
        return False
    (length,) = struct.unpack("<Q", head[:8])
    return 0 < length <= min(_MAX_HEADER, size - 8) and head[8:9] == b"{"


def entries(path: str | os.PathLike) -> dict[str, tuple]:
    """``{name: (dtype, shape, file_offset)}`` for every tensor, from the header only."""
    header, data_start, size = _read_header(path)
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        try:
            dtype = _FROM_NAME[info["dtype"]]
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise SafetensorsError(
                f"safetensors file '{path}': bad entry for {quoted(name)}: {quoted(info)}"
            ) from e
        itemsize = torch.empty(0, dtype=dtype).element_size()
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * itemsize or begin < 0 or data_start + end > size:
            raise SafetensorsError(
                f"safetensors file '{path}': data of {quoted(name)} is out of bounds."
            )
        out[name] = (dtype, shape, data_start + begin)
    return out


def _read_entry(path, name, entry) -> torch.Tensor:
    dtype, shape, offset = entry
    storage_dtype = torch.int16 if dtype is torch.bfloat16 else dtype
    np_dtype = torch.empty(0, dtype=storage_dtype).numpy().dtype
    count = int(np.prod(shape, dtype=np.int64))
    with open_regular_file(path, "checkpoint") as f:
        array = np.fromfile(f, dtype=np_dtype, count=count, offset=offset)
    tensor = torch.from_numpy(array.reshape(shape))
    return tensor.view(torch.bfloat16) if dtype is torch.bfloat16 else tensor


def read(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Reads every tensor of a safetensors file into memory."""
    return {name: _read_entry(path, name, entry) for name, entry in entries(path).items()}


def read_tensor(path: str | os.PathLike, name: str) -> torch.Tensor:
    """Reads one tensor (and nothing else) of a safetensors file."""
    table = entries(path)
    if name not in table:
        raise KeyError(
            f"safetensors file '{path}' has no tensor {quoted(name)}; it has {sorted(table)[:20]}."
        )
    return _read_entry(path, name, table[name])


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    header, _, _ = _read_header(path)
    return dict(header.get("__metadata__") or {})


def write(
    path: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str] | None = None,
) -> None:
    """Writes ``tensors`` (name -> CPU tensor) and string ``metadata`` to a new file."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    arrays, offset = [], 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPES:
            raise CstorchValueError(f"safetensors cannot store {name!r} of dtype {tensor.dtype}")
        plain = tensor.detach().cpu().contiguous()
        if plain.dtype is torch.bfloat16:
            plain = plain.view(torch.int16)
        array = numpy_view(plain)  # leaves the storage resizable (conversions.numpy_view)
        header[name] = {
            "dtype": _DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        arrays.append(array)
        offset += array.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # align the data to 8 bytes, as the library does
    with open(path, "xb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for array in arrays:
            f.write(array.reshape(-1).view(np.uint8).data)


def _read_header(path):
    with open_regular_file(path, "checkpoint") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"'{path}' is too short to be a safetensors file.")
        (length,) = struct.unpack("<Q", head)
        if length > min(_MAX_HEADER, size - 8):
            raise SafetensorsError(f"'{path}': safetensors header length {length} is invalid.")
        try:
            header = json.loads(f.read(length))
        except ValueError as e:
            raise SafetensorsError(f"'{path}': safetensors header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise SafetensorsError(f"'{path}': safetensors header is not a JSON object.")
    return header, 8 + length, size
