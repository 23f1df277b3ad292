"""``python -m cstorch.storage``: inspect and convert checkpoints.

``info CKPT`` prints the tree of keys with each leaf's kind, dtype, shape and size in bytes,
then the totals. For H5 checkpoints it reads metadata only (no tensor data, no unpickling).

``convert CKPT OUT`` loads any checkpoint ``cstorch.load`` reads and writes it as

* ``*.safetensors``: tensors under their dotted keys; str/int/float/bool/None leaves go into
  the header's ``__metadata__`` as JSON strings; other leaves are reported and skipped;
* ``*.mdl`` / ``*.h5`` / ``*.hdf5``: a cstorch H5 checkpoint;
* anything else: a torch pickle (``torch.save``), tied tensors kept tied.

``OUT`` is never overwritten.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Iterable

import numpy as np
import torch

from cstorch.storage import constants as C, safetensors_format, treespec
from cstorch.storage.deferred import DeferredTensor
from cstorch.storage.h5_format import H5Reader
from cstorch.storage.load import load
from cstorch.storage.save import save


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cstorch.storage", description="Inspect and convert cstorch checkpoints."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    info_parser = commands.add_parser("info", help="print the keys, dtypes, shapes and sizes")
    info_parser.add_argument("ckpt")
    info_parser.add_argument(
        "--unsafe-allow-pickle",
        action="store_true",
        help="allow unpickling objects of torch checkpoints (trusted files only)",
    )
    convert_parser = commands.add_parser(
        "convert", help="write CKPT as .safetensors, .mdl or torch .pt"
    )
    convert_parser.add_argument("ckpt")
    convert_parser.add_argument("out")
    convert_parser.add_argument(
        "--unsafe-allow-pickle",
        action="store_true",
        help="allow unpickling arbitrary objects (trusted files only)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "info":
            print_info(args.ckpt, unsafe_allow_pickle=args.unsafe_allow_pickle)
        else:
            convert(args.ckpt, args.out, unsafe_allow_pickle=args.unsafe_allow_pickle)
    except (OSError, RuntimeError, ValueError, TypeError, NotImplementedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------------------------
# info


def describe(
    path: str, *, unsafe_allow_pickle: bool = False
) -> list[tuple[tuple, str, str, str, int]]:
    """(path components, kind, dtype, shape, bytes) for every leaf of a checkpoint."""
    if H5Reader.is_hdf5(path):
        reader = H5Reader(path)
        attributes = reader.root_attributes()
        if float(attributes.get(C.__VERSION__, 0.1)) >= C.CURRENT_CKPT_FORMAT_VERSION:
            return _describe_h5(reader, attributes)
    state = load(path, unsafe_allow_pickle=unsafe_allow_pickle)
    flat = treespec.flatten(state)
    return [(p, *_describe_value(v)) for p, v in zip(flat.spec.paths(), flat.leaves)]


def _describe_h5(reader: H5Reader, attributes: dict):
    spec = treespec.loads(json.loads(attributes[C.__SPEC__])[1])
    rows = []
    for parts in spec.paths():
        key = ".".join(parts)
        metadata = json.loads(attributes[f"{key}.{C.__METADATA__}"])
        leaf = metadata.get(f"{key}.{C.__METADATA__}")
        if leaf is None:
            rows.append((parts, "CSX deferred entry", "", "", 0))
            continue
        kind = leaf.get(C.__TYPE__, "?")
        if leaf.get(C.TORCH_FLAG):
            dtype = C.torch_dtype_from_name(leaf["dtypes"][0])
            shape = leaf["shapes"][0]
            size = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
            rows.append((parts, "tensor", str(dtype).replace("torch.", ""), str(list(shape)), size))
        elif kind == C.NUMPY_ARRAY:
            dset = reader.dataset(key)
            rows.append(
                (
                    parts,
                    "ndarray",
                    str(dset.dtype),
                    str(list(dset.shape)),
                    dset.dtype.itemsize * dset.size,
                )
            )
        elif kind == C.OBJECT:
            payload = reader.read_bytes(key) or b""
            rows.append((parts, "object (pickled)", "", "", len(payload)))
        elif kind == C.LINKED:
            rows.append((parts, f"-> {leaf['key']}", "", "", 0))
        else:
            value = leaf.get("scalar_value", leaf.get("string_value"))
            rows.append((parts, type(value).__name__, "", repr(value)[:40], 0))
    return rows


def _describe_value(value):
    if isinstance(value, torch.Tensor):
        return (
            "tensor",
            str(value.dtype).replace("torch.", ""),
            str(list(value.shape)),
            value.numel() * value.element_size(),
        )
    if isinstance(value, np.ndarray):
        return "ndarray", str(value.dtype), str(list(value.shape)), value.nbytes
    return type(value).__name__, "", repr(value)[:40], 0


def print_info(path: str, *, unsafe_allow_pickle: bool = False, out=None) -> None:
    out = out or sys.stdout
    rows = describe(path, unsafe_allow_pickle=unsafe_allow_pickle)
    print(f"{path}", file=out)
    printed: tuple = ()
    for parts, kind, dtype, shape, size in rows:
        common = 0
        while common < min(len(printed), len(parts) - 1) and printed[common] == parts[common]:
            common += 1
        for depth in range(common, len(parts) - 1):
            print(f"{'  ' * (depth + 1)}{parts[depth]}/", file=out)
        name = parts[-1] if parts else "<root>"
        indent = "  " * len(parts)
        size_text = f"{size:>14,d} B" if size else ""
        print(
            f"{indent}{name:<{max(1, 40 - len(indent))}} {kind:<18} {dtype:<10} {shape:<20} {size_text}",
            file=out,
        )
        printed = tuple(parts[:-1])
    tensors = sum(1 for r in rows if r[1] in ("tensor", "ndarray"))
    total = sum(r[4] for r in rows)
    print(
        f"total: {len(rows)} leaves, {tensors} arrays, {total:,d} bytes ({total / 2**20:.2f} MiB)",
        file=out,
    )


# --------------------------------------------------------------------------------------------
# convert


def convert(src: str, dst: str, *, unsafe_allow_pickle: bool = False, report=None) -> None:
    report = report or sys.stderr
    if os.path.lexists(dst):
        raise FileExistsError(f"'{dst}' already exists; convert never overwrites. Remove it first.")
    state = load(src, unsafe_allow_pickle=unsafe_allow_pickle)
    if dst.endswith((".mdl", ".h5", ".hdf5")):
        save(state, dst)
        return
    flat = treespec.flatten(state)
    materialized: dict[int, torch.Tensor] = {}

    def plain(value):
        if isinstance(value, DeferredTensor):
            if id(value) not in materialized:  # one read per tied tensor
                materialized[id(value)] = value._materialize(cache_override=False)
            return materialized[id(value)]
        return value

    leaves = [plain(v) for v in flat.leaves]
    if dst.endswith(".safetensors"):
        tensors, metadata = {}, {}
        for key, value in zip(flat.keys, leaves):
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
                tensors[key] = torch.from_numpy(np.ascontiguousarray(value))
            elif value is None or isinstance(value, (str, int, float, bool)):
                metadata[key] = json.dumps(value)
            else:
                print(
                    f"skipped {key!r}: a {type(value).__name__} cannot go into a safetensors file",
                    file=report,
                )
        safetensors_format.write(dst, tensors, metadata)
        return
    with open(dst, "xb") as f:
        torch.save(flat.spec.unflatten(iter(leaves)), f)
