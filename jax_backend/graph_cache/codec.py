"""A ``CapturedStep`` as data, and back: the payload of an entry and its hostile-input checks.

The payload is a zip (``pack``/``unpack``) holding ``entry``, UTF-8 JSON, and the graph's
constant tensors as raw bytes, read with ``allow_pickle=False``. The JSON holds the format
version, the key, the graph's nodes (op kind; target as the name of an ATen/custom
``OpOverload``, resolved through ``torch.ops`` and accepted only if it has a lowering, or
``getitem``; arguments built from a closed set of scalar types, dtypes, devices, layouts,
memory formats, tuples, lists and node references; each node's result shape, stride and
dtype), the state and output layout, the output structure (tuples, lists, dicts and
``None`` only), non-tensor outputs (JSON scalars only), the caller's ``extras`` (plain JSON),
and the files the entry depends on. A ``cstorch::optimizer_step`` node carries its spec as
its first argument (a string, checked with ``torch_ops.optimizer_spec`` on decoding).

Node metadata comes back as meta tensors (shape, stride, dtype: all the lowering reads).
A graph holding a ``cstorch::optax_update`` (a user's Python object) is not stored.
Nothing read is executed (no pickle, ``eval`` or ``torch.load``), and whatever is not what
this version writes raises ``CorruptEntry``: the HMAC in front of the payload (see
``storage.py``) keeps out other writers, and these checks stand behind it.
"""

from __future__ import annotations

import io
import json
import operator
import re
import zipfile

import numpy as np
import torch
import torch.fx
from torch.utils import _pytree as pytree

from jax_backend import (
    optax_ops,  # noqa: F401  (registers cstorch::optax_update, read below)
    scalars,
    torch_ops,
    torch_versions,
)
from jax_backend.capture import CapturedStep
from jax_backend.errors import CstorchError
from jax_backend.graph_cache import fingerprint
from jax_backend.graph_cache.key import versions
from jax_backend.registry import has_lowering, lowered_namespaces

#: Bounds on what is read back: larger or stranger entries are refused as corrupt.
MAX_FILE_BYTES = 512 * 1024 * 1024
MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_NODES = 1_000_000
MAX_RANK = 16
MAX_DIM = 1 << 40
MAX_DEPTH = 64


class CorruptEntry(CstorchError, ValueError):
    """An entry's content is not what this version writes."""


def _named_values(kind) -> dict:
    return {str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, kind)}


_DTYPES = _named_values(torch.dtype)
_LAYOUTS = _named_values(torch.layout)
_MEMORY_FORMATS = _named_values(torch.memory_format)
_DEVICE = re.compile(r"^(cpu|meta|cuda)(:[0-9]{1,4})?$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,200}$")
_SCALARS = (type(None), bool, int, float, str)
_OPTIMIZER_STEP = torch.ops.cstorch.optimizer_step.default
_OPTAX_UPDATE = torch.ops.cstorch.optax_update.default


class _Encoder:
    """CapturedStep -> (JSON-able dict, constant tensors). Raises NotCacheable for anything
    outside the closed set of value kinds the decoder accepts."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.index: dict = {}
        self.constants: list = []

    def value(self, v):
        if isinstance(v, torch.fx.Node):
            return {"node": self.index[v]}
        if type(v) in _SCALARS:
            return v
        if isinstance(v, torch.dtype):
            return {"dtype": str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {"device": str(v)}
        if isinstance(v, torch.layout):
            return {"layout": str(v).removeprefix("torch.")}
        if isinstance(v, torch.memory_format):
            return {"memory_format": str(v).removeprefix("torch.")}
        if isinstance(v, torch.Tensor):
            return {"const": self.constant(v)}
        if isinstance(v, tuple) and type(v) is tuple:
            return {"tuple": [self.value(x) for x in v]}
        if isinstance(v, list):  # fx's immutable_list too
            return [self.value(x) for x in v]
        raise fingerprint.NotCacheable(f"a graph argument of type {type(v).__name__}")

    def constant(self, tensor) -> int:
        if type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
            raise fingerprint.NotCacheable(f"a {type(tensor).__name__} graph constant")
        self.constants.append(tensor.detach().contiguous())
        return len(self.constants) - 1

    def meta(self, v):
        if isinstance(v, torch.Tensor):
            return {
                "tensor": [str(v.dtype).removeprefix("torch."), list(v.shape), list(v.stride())]
            }
        if isinstance(v, (list, tuple)):
            return {"tuple" if isinstance(v, tuple) else "list": [self.meta(x) for x in v]}
        if type(v) in (type(None), bool, int, float):
            return v
        if isinstance(v, scalars.ScalarMeta):
            return {"scalar": [v.kind]}
        raise fingerprint.NotCacheable(f"node metadata of type {type(v).__name__}")

    def node(self, n: torch.fx.Node) -> list:
        target: int | str | None
        if n.op in ("placeholder", "output"):
            target = None
        elif n.op == "get_attr":
            target = self.constant(getattr(self.gm, str(n.target)))
        elif n.op == "call_function" and n.target is operator.getitem:
            target = "getitem"
        elif n.op == "call_function" and n.target in scalars.NAME_OF:
            target = "scalar::" + scalars.NAME_OF[n.target]
        elif n.op == "call_function" and n.target is _OPTAX_UPDATE:
            raise fingerprint.NotCacheable("an optax transformation (a Python object)")
        elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            target = _op_name(n.target)
        else:
            raise fingerprint.NotCacheable(f"a graph node {n.op} {n.target}")
        encoded = [
            n.op,
            target,
            self.value(list(n.args)),
            {k: self.value(v) for k, v in n.kwargs.items()},
            self.meta(n.meta.get("val")),
        ]
        self.index[n] = len(self.index)
        return encoded


def _op_name(op) -> str:
    namespace, name = op.name().split("::")
    return f"{namespace}::{name.split('.')[0]}.{op._overloadname}"


def _encode_spec(spec: pytree.TreeSpec):
    if spec.is_leaf():
        return "*"
    children = [_encode_spec(c) for c in torch_versions.treespec_children(spec)]
    if spec.type is tuple:
        return {"tuple": children}
    if spec.type is list:
        return {"list": children}
    if spec.type is dict and all(type(k) in (str, int) for k in spec.context):
        return {"dict": [[k, c] for k, c in zip(spec.context, children)]}
    if spec.type is type(None):
        return {"none": None}
    raise fingerprint.NotCacheable(f"an output container of type {spec.type.__name__}")


def encode(captured: CapturedStep, extras: dict, files: dict, key: str):
    """(JSON bytes, constant tensors) of an entry. Raises NotCacheable."""
    for c in captured.output_constants:
        if type(c) not in _SCALARS or (isinstance(c, str) and len(c) > 10_000):
            raise fingerprint.NotCacheable(f"a non-tensor output of type {type(c).__name__}")
    spec = _encode_spec(captured.output_spec)
    if _decode_spec(spec) != captured.output_spec:
        raise fingerprint.NotCacheable("an output structure that does not round-trip")
    encoder = _Encoder(captured.graph)
    nodes = [encoder.node(n) for n in captured.graph.graph.nodes]
    document = {
        "versions": versions(),
        "key": key,
        "files": files,
        "nodes": nodes,
        "constants": [
            [str(t.dtype).removeprefix("torch."), list(t.shape)] for t in encoder.constants
        ],
        "used_state": captured.used_state,
        "written_state": captured.written_state,
        "num_inputs": captured.num_inputs,
        "output_spec": spec,
        "output_is_tensor": captured.output_is_tensor,
        "output_constants": captured.output_constants,
        "extras": extras,
        "used_scalars": captured.used_scalars,
        "scalar_kinds": [[i, kind] for i, kind in sorted(captured.scalar_kinds.items())],
        "scalar_outputs": captured.scalar_outputs,
    }
    text = json.dumps(document, separators=(",", ":"), allow_nan=True)
    return text.encode(), encoder.constants


def pack(captured: CapturedStep, extras: dict, files: dict, key: str) -> bytes:
    """The payload of an entry: ``encode``'s JSON and constants, zipped. Raises
    NotCacheable (also for an entry too large to be read back)."""
    text, constants = encode(captured, extras, files, key)
    if len(text) > MAX_JSON_BYTES or sum(t.nbytes for t in constants) > MAX_FILE_BYTES // 2:
        raise fingerprint.NotCacheable("too large")
    arrays = {"entry": np.frombuffer(text, dtype=np.uint8)}
    for i, t in enumerate(constants):
        arrays[f"c{i}"] = (
            t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
        )
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


# -------------------------------------------------------------------------------- decoding
def check(condition, what):
    """Raises CorruptEntry(``what``) unless ``condition``."""
    if not condition:
        raise CorruptEntry(what)


def _int_list(v, what, limit) -> list:
    check(isinstance(v, list) and len(v) <= MAX_RANK, f"{what} is not a short list")
    check(all(type(x) is int and 0 <= x <= limit for x in v), f"{what} holds a bad number")
    return v


def _resolve_op(name):
    if name == "getitem":
        return operator.getitem
    if isinstance(name, str) and name.startswith("scalar::"):
        function = name[len("scalar::") :]
        check(function in scalars.FUNCTIONS, f"unknown scalar function {name[:80]!r}")
        return scalars.FUNCTIONS[function][0]
    check(isinstance(name, str) and len(name) < 300, "an op name is not a string")
    namespace, _, rest = name.partition("::")
    op_name, _, overload = rest.partition(".")
    check(
        all(_NAME.match(p) and not p.startswith("__") for p in (namespace, op_name, overload))
        and namespace in lowered_namespaces(),
        f"malformed op name {name[:80]!r}",
    )
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), op_name), overload)
    except (AttributeError, RuntimeError) as err:
        raise CorruptEntry(f"unknown op {name!r}") from err
    check(
        isinstance(op, torch._ops.OpOverload) and has_lowering(op),
        f"op {name!r} is not a lowered ATen operator",
    )
    return op


class _Decoder:
    def __init__(self, constants: list):
        self.constants = constants
        self.nodes: list = []

    def value(self, v, depth=0):
        check(depth < MAX_DEPTH, "arguments nest too deeply")
        if type(v) in _SCALARS:
            return v
        if isinstance(v, list):
            return [self.value(x, depth + 1) for x in v]
        check(isinstance(v, dict) and len(v) == 1, "an argument of unknown form")
        ((tag, x),) = v.items()
        if tag == "node":
            check(type(x) is int and 0 <= x < len(self.nodes), "a reference to a later node")
            return self.nodes[x]
        if tag == "tuple":
            check(isinstance(x, list), "a malformed tuple")
            return tuple(self.value(y, depth + 1) for y in x)
        if tag == "dtype" and x in _DTYPES:
            return _DTYPES[x]
        if tag == "layout" and x in _LAYOUTS:
            return _LAYOUTS[x]
        if tag == "memory_format" and x in _MEMORY_FORMATS:
            return _MEMORY_FORMATS[x]
        if tag == "device" and isinstance(x, str) and _DEVICE.match(x):
            return torch.device(x)
        if tag == "const" and type(x) is int and 0 <= x < len(self.constants):
            return self.constants[x]
        raise CorruptEntry(f"an argument tagged {str(tag)[:40]!r} with a bad value")

    def meta(self, v, depth=0):
        check(depth < MAX_DEPTH, "metadata nests too deeply")
        if type(v) in (type(None), bool, int, float):
            return v
        check(isinstance(v, dict) and len(v) == 1, "metadata of unknown form")
        ((tag, x),) = v.items()
        check(isinstance(x, list), "malformed metadata")
        if tag == "tensor":
            check(len(x) == 3 and x[0] in _DTYPES, "malformed tensor metadata")
            shape = _int_list(x[1], "a shape", MAX_DIM)
            stride = _int_list(x[2], "a stride", MAX_DIM)
            check(len(shape) == len(stride), "shape and stride differ in rank")
            return torch.empty_strided(shape, stride, dtype=_DTYPES[x[0]], device="meta")
        if tag in ("tuple", "list"):
            items = [self.meta(y, depth + 1) for y in x]
            return tuple(items) if tag == "tuple" else items
        if tag == "scalar":
            check(x in (["float"], ["int"], ["bool"]), "malformed scalar metadata")
            return scalars.ScalarMeta(x[0])
        raise CorruptEntry("metadata of unknown form")


def _decode_spec(v) -> pytree.TreeSpec:
    return pytree.tree_structure(_spec_example(v, 0, [0]))


def _spec_example(v, depth, count):
    """A container with the structure ``v`` describes (leaves are 0)."""
    count[0] += 1
    check(depth < MAX_DEPTH and count[0] < 100_000, "the output structure is too large")
    if v == "*":
        return 0
    check(isinstance(v, dict) and len(v) == 1, "a malformed output structure")
    ((tag, x),) = v.items()
    if tag == "none":
        return None
    check(isinstance(x, list), "a malformed output structure")
    if tag in ("tuple", "list"):
        items = [_spec_example(c, depth + 1, count) for c in x]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        check(
            all(isinstance(p, list) and len(p) == 2 and type(p[0]) in (str, int) for p in x),
            "a malformed output dict",
        )
        return {k: _spec_example(c, depth + 1, count) for k, c in x}
    raise CorruptEntry(f"an output container tagged {str(tag)[:40]!r}")


def _read_constants(doc, arrays) -> list:
    specs = doc["constants"]
    check(isinstance(specs, list) and len(specs) == len(arrays), "constants do not match")
    constants = []
    for (dtype_name, shape), raw in zip(specs, arrays):
        check(dtype_name in _DTYPES, "a constant of unknown dtype")
        dtype = _DTYPES[dtype_name]
        _int_list(shape, "a constant's shape", MAX_DIM)
        numel = 1
        for d in shape:
            numel *= d
        check(raw.nbytes == numel * dtype.itemsize, "a constant of the wrong size")
        flat = (
            torch.frombuffer(bytearray(raw.tobytes()), dtype=torch.uint8)
            if raw.nbytes
            else torch.empty(0, dtype=torch.uint8)
        )
        constants.append(flat.view(dtype).reshape(shape))
    return constants


def _is_optimizer_spec(config) -> bool:
    """Whether an optimizer step's first argument is a spec ``optimizer_config`` makes."""
    try:
        torch_ops.optimizer_spec(config)
    except ValueError:
        return False
    return True


def decode(doc: dict, arrays: list, state: list, inputs: list):
    """(CapturedStep, extras) from an entry's JSON and constant arrays, for a step over the
    unique ``state`` tensors and ``inputs`` (whose shapes and dtypes its placeholders must
    have), then runtime scalars. Raises CorruptEntry."""
    num_state = len(state)
    check(isinstance(doc, dict), "not a JSON object")
    nodes = doc["nodes"]
    check(isinstance(nodes, list) and 2 <= len(nodes) <= MAX_NODES, "a bad node count")
    decoder = _Decoder(_read_constants(doc, arrays))
    graph = torch.fx.Graph()
    attrs, placeholders, output_seen = {}, 0, False
    for encoded in nodes:
        check(
            isinstance(encoded, list) and len(encoded) == 5 and not output_seen, "a malformed node"
        )
        op, target, args, kwargs, meta = encoded
        check(isinstance(args, list) and isinstance(kwargs, dict), "malformed arguments")
        if op == "placeholder":
            check(placeholders == len(decoder.nodes), "a placeholder after other nodes")
            node = graph.placeholder(f"arg{placeholders}")
            placeholders += 1
        elif op == "get_attr":
            check(type(target) is int and 0 <= target < len(decoder.constants), "a bad constant")
            name = f"_const{target}"
            attrs[name] = decoder.constants[target]
            node = graph.get_attr(name)
        elif op == "call_function":
            check(all(isinstance(k, str) and _NAME.match(k) for k in kwargs), "a bad keyword")
            op = _resolve_op(target)
            check(op is not _OPTAX_UPDATE, "an optax update")
            check(
                op is not _OPTIMIZER_STEP
                or (args and isinstance(args[0], str) and _is_optimizer_spec(args[0])),
                "an optimizer step without a valid spec",
            )
            node = graph.call_function(
                op,
                tuple(decoder.value(a) for a in args),
                {k: decoder.value(v) for k, v in kwargs.items()},
            )
        elif op == "output":
            check(len(args) == 1 and isinstance(args[0], list) and not kwargs, "a malformed output")
            node = graph.output(decoder.value(args[0]))
            output_seen = True
        else:
            raise CorruptEntry(f"a node of kind {str(op)[:40]!r}")
        node.meta["val"] = decoder.meta(meta)
        decoder.nodes.append(node)
    check(output_seen, "no output node")

    used, written = doc["used_state"], doc["written_state"]
    num_inputs, is_tensor = doc["num_inputs"], doc["output_is_tensor"]
    constants = doc["output_constants"]
    for name, indices in (("used", used), ("written", written)):
        check(
            isinstance(indices, list)
            and len(set(indices)) == len(indices)
            and all(type(i) is int and 0 <= i < num_state for i in indices),
            f"bad {name} state indices",
        )
    used_scalars, kinds = doc["used_scalars"], doc["scalar_kinds"]
    numbers = doc["scalar_outputs"]
    check(
        isinstance(used_scalars, list)
        and len(set(used_scalars)) == len(used_scalars)
        and all(type(i) is int and 0 <= i < MAX_NODES for i in used_scalars),
        "bad scalar indices",
    )
    check(
        isinstance(kinds, list)
        and all(
            isinstance(k, list)
            and len(k) == 2
            and type(k[0]) is int
            and 0 <= k[0] < MAX_NODES
            and k[1] in (scalars.SIGN, scalars.VALUE)
            for k in kinds
        ),
        "bad scalar kinds",
    )
    check(
        type(num_inputs) is int
        and placeholders == len(used) + num_inputs + len(used_scalars)
        and num_inputs == len(inputs),
        "placeholders do not match the state and inputs",
    )
    for node, tensor in zip(decoder.nodes, [state[i] for i in used] + list(inputs)):
        val = node.meta["val"]
        check(
            isinstance(val, torch.Tensor)
            and val.shape == tensor.shape
            and val.dtype == tensor.dtype,
            "a placeholder of another shape or dtype",
        )
    check(
        all(
            isinstance(node.meta["val"], scalars.ScalarMeta)
            for node in decoder.nodes[len(used) + num_inputs : placeholders]
        ),
        "a bad scalar placeholder",
    )
    check(
        isinstance(is_tensor, list)
        and all(type(b) is bool for b in is_tensor)
        and isinstance(constants, list)
        and len(constants) == len(is_tensor)
        and all(type(c) in _SCALARS and (c is None or not t) for c, t in zip(constants, is_tensor)),
        "bad output leaves",
    )
    outputs = decoder.nodes[-1].args[0]
    check(
        len(outputs) == len(written) + sum(is_tensor)
        and all(isinstance(o, torch.fx.Node) for o in outputs),
        "bad graph outputs",
    )
    spec = _decode_spec(doc["output_spec"])
    check(spec.num_leaves == len(is_tensor), "the output structure does not match")
    check(
        isinstance(numbers, list)
        and all(type(i) is int and 0 <= i < len(is_tensor) and is_tensor[i] for i in numbers),
        "bad scalar outputs",
    )
    captured = CapturedStep(
        graph=torch.fx.GraphModule(attrs, graph),
        used_state=used,
        written_state=written,
        num_inputs=num_inputs,
        output_spec=spec,
        output_is_tensor=is_tensor,
        output_constants=constants,
        used_scalars=used_scalars,
        scalar_kinds={i: kind for i, kind in kinds},
        scalar_outputs=numbers,
    )
    return captured, doc["extras"]


def unpack(payload: bytes):
    """(JSON document, constant arrays) of a payload, its zip and array headers checked
    before anything is read into memory."""
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        members = archive.infolist()
        check(all(m.compress_type == zipfile.ZIP_STORED for m in members), "compressed members")
        check(sum(m.file_size for m in members) <= MAX_FILE_BYTES, "members too large")
        names = [m.filename for m in members]
        check(
            names
            and names[0] == "entry.npy"
            and names[1:] == [f"c{i}.npy" for i in range(len(names) - 1)],
            "unexpected members",
        )
        for member in members:  # a header must not promise more than its member holds
            with archive.open(member) as f:
                version = np.lib.format.read_magic(f)
                check(version in ((1, 0), (2, 0)), "an unknown array format")
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(f)
                check(
                    dtype == np.uint8 and len(shape) == 1 and shape[0] <= member.file_size,
                    "an array larger than its member",
                )
    with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
        raw = npz["entry"]
        check(
            raw.dtype == np.uint8 and raw.ndim == 1 and raw.nbytes <= MAX_JSON_BYTES,
            "a malformed entry record",
        )
        arrays = [npz[f"c{i}"] for i in range(len(names) - 1)]
    check(all(a.dtype == np.uint8 and a.ndim == 1 for a in arrays), "malformed constants")
    return json.loads(raw.tobytes().decode("utf-8")), arrays


def files_of(doc, key: str) -> dict:
    """The ``{path: digest}`` files of an entry that ``doc`` says is for this version and
    ``key`` (checked). Raises CorruptEntry."""
    check(isinstance(doc, dict), "not a JSON object")
    check(doc.get("versions") == versions(), "written by another version")
    check(doc.get("key") == key, "stored under another key")
    files = doc.get("files")
    check(
        isinstance(files, dict) and all(isinstance(v, str) for v in files.values()),
        "a malformed file list",
    )
    return files
