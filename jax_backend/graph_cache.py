"""A persistent cache of captured steps, so a second run of an unchanged script skips capture.

**Off unless asked for** (``CSTORCH_GRAPH_CACHE=DIR``, or ``on`` for
``$XDG_CACHE_HOME/cstorch-jax/graphs``): a hit replays the graph of an earlier process, so
it is only right if the key covers everything the step read while it was traced, and some
reads (the time, a network answer, a file read by C code) cannot be keyed. JAX's persistent
cache (``compilation_cache``, on by default, never stale) already skips XLA compilation;
this cache skips the capture on top of it (about a second on a small model).

An entry stores a ``CapturedStep`` as data:

* one file ``<key>.npz``: ``MAGIC``, an HMAC-SHA256 of the key and the payload, then the
  payload, a zip holding ``entry``, the UTF-8 JSON below, and the graph's constant tensors
  as raw bytes, read with ``allow_pickle=False``. It is written to a temporary name and
  renamed, so readers see a whole entry or none;
* the JSON: the format version, the key, the graph's nodes (op kind; target as the name of
  an ATen/custom ``OpOverload``, resolved through ``torch.ops`` and accepted only if it has a
  lowering, or ``getitem``; arguments built from a closed set of scalar types, dtypes,
  devices, layouts, memory formats, tuples, lists and node references; each node's result
  shape, stride and dtype), the state and output layout, the output structure (tuples,
  lists, dicts and ``None`` only), non-tensor outputs (JSON scalars only), the caller's
  ``extras`` (plain JSON), the specs of the ``cstorch::optimizer_step`` nodes (whose key is
  a hash of the spec, checked), and the files the entry depends on.

Node metadata comes back as meta tensors (shape, stride, dtype: all the lowering reads).
A graph holding a ``cstorch::optax_update`` (a user's Python object) is not stored.

**Integrity.** The directory must be this user's and not writable by others (a new one is
made 0700; in a shared directory such as a 1777 one, a private subdirectory
``cstorch-graphs-uid<N>`` is used instead; if that is not possible the cache is off, with
one warning). It holds a random per-user secret (``SECRET``, 0600, created atomically);
every entry carries the HMAC of its key and content under that secret. An entry is opened
with ``O_NOFOLLOW | O_NONBLOCK`` and checked with ``fstat`` before a byte is read: a
symbolic link, a FIFO or device, a file of another owner, or one larger than
``MAX_FILE_BYTES`` is refused, and so is any entry whose HMAC does not match (edited,
re-zipped, copied from elsewhere). Nothing read from an entry is executed: no pickle,
``eval`` or ``torch.load``. An entry that is refused, truncated, corrupt, of another format,
names an op that is not lowered, or whose placeholders do not have the shapes and dtypes of
the current state and inputs, is a miss with a one-line ``GraphCacheWarning``; a missing
entry is a silent miss.

**The key** (``step_key``) is a sha256 over the caller's ``Fingerprinter`` (the step's code
and every value reachable from it, see ``fingerprint.py``), the process's inputs
(``sys.argv``, the environment but ``IGNORED_ENVIRONMENT``, the working directory), user
code installed in library modules (``fingerprint.replaced_library_attributes``), the
decompositions, the state layout (each slot's name, shape, dtype, ``requires_grad`` and
which slots share a tensor), the inputs (shape, stride, dtype), the caller's ``selection``
(plain data: what selects a program in the caller, for cstorch its ``ProgramSignature``
rendered field by field, which holds the precision policy), torch's global modes and module
hooks (an active torch function/dispatch mode makes a step not cacheable), the caller's
``extra`` string, and the torch, jax, jaxlib, Python and project versions.

**The files** are checked on load: every loaded module outside torch, jax, jaxlib and the
standard library is listed in the entry with the sha256 of its bytes (installed packages
under site-packages: size and modification time), and so is every file opened through
Python while the step was traced (``watching_capture``: a config or data file read by
``open``, ``json``, ``numpy``); any difference, or a module now loaded that the entry does
not list, is a miss. A capture that opens a file for writing, a FIFO or a device, or draws
numbers from Python's or numpy's global random generator, is not stored. This covers every
file whose code could have run during the capture (this project's included) without
tracing the capture itself: recording executed code with ``sys.settrace``/``cProfile`` was
measured to double capture time, which every first run would pay.

The directory is safe to delete at any time. Hits, misses and stores are reported as
``jax.monitoring`` events (``EVENT_*``) and logged at debug level by the
``jax_backend.graph_cache`` logger.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import hmac
import importlib.metadata
import io
import json
import logging
import operator
import os
import random
import re
import site
import stat
import sys
import sysconfig
import tempfile
import threading
import warnings
import zipfile

import jax
import jax.monitoring
import numpy as np
import torch
import torch.fx
from torch.utils import _pytree as pytree

from jax_backend import fingerprint, optimizers, torch_ops, torch_versions
from jax_backend.errors import CstorchError
from jax_backend.capture import CapturedStep
from jax_backend import config
from jax_backend.config import graph_cache as _setting
from jax_backend.registry import has_lowering, lowered_namespaces
from jax_backend.regular_files import open_regular
from jax_backend.state_guard import plain_type

ENV_VAR = _setting.env_var
FORMAT = 2
MAGIC = b"cstorch-graph-cache 2\n"
SECRET = ".hmac-secret"
SECRET_BYTES = 32

#: Environment variables left out of the key: they differ between terminal or SSH sessions
#: and say nothing a step could compute with (and the cache's own location), and those the
#: libraries set themselves during a first trace (``fingerprint.LIBRARY_SET_ENVIRONMENT``).
IGNORED_ENVIRONMENT = frozenset({
    ENV_VAR, "_", "OLDPWD", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK",
    "XDG_SESSION_ID", "TERM_SESSION_ID", "WINDOWID", "TMUX_PANE"}) \
    | fingerprint.LIBRARY_SET_ENVIRONMENT

#: Bounds on what is read back: larger or stranger entries are refused as corrupt.
MAX_FILE_BYTES = 512 * 1024 * 1024
MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_NODES = 1_000_000
MAX_RANK = 16
MAX_DIM = 1 << 40
MAX_DEPTH = 64

EVENT_HIT = "/cstorch_jax/graph_cache/hit"
EVENT_MISS = "/cstorch_jax/graph_cache/miss"
EVENT_STORE = "/cstorch_jax/graph_cache/store"

logger = logging.getLogger(__name__)


class GraphCacheWarning(UserWarning):
    """A graph cache entry could not be used (corrupt, truncated, foreign or refused); the
    step is captured again and the entry replaced."""


class CorruptEntry(CstorchError, ValueError):
    """An entry's content is not what this version writes."""


# ------------------------------------------------------------------------------ directory
def default_directory() -> str | None:
    """The cache directory the environment asks for, or None (the default: off)."""
    return config.cache_directory(_setting, "graphs")


def _user() -> int:
    return os.geteuid()


def _is_private(st: os.stat_result) -> bool:
    """A directory of this user that no one else can write to."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == _user() and not st.st_mode & 0o022


@dataclasses.dataclass(frozen=True)
class _Directory:
    path: str
    secret: bytes


_directories: dict = {}  # requested path -> _Directory, or None once refused
_directories_lock = threading.Lock()


def _open_directory(directory: str) -> _Directory | None:
    """The usable form of ``directory`` (once per process), or None, with one warning."""
    with _directories_lock:
        if directory not in _directories:
            try:
                _directories[directory] = _prepare(directory)
            except OSError as err:
                warnings.warn(f"The graph cache is off: {err}", GraphCacheWarning, stacklevel=3)
                _directories[directory] = None
        return _directories[directory]


def _prepare(directory: str) -> _Directory:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.stat(directory)
    if not _is_private(st):
        private = os.path.join(directory, f"cstorch-graphs-uid{_user()}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(private, 0o700)
        sub = os.lstat(private)
        if not _is_private(sub) or sub.st_mode & 0o077:
            shared = "writable by others" if st.st_uid == _user() else "another user's"
            raise OSError(
                f"{directory!r} is {shared} (mode {stat.filemode(st.st_mode)}) and its "
                f"private subdirectory {private!r} is not this user's alone (mode "
                f"{stat.filemode(sub.st_mode)}, owner {sub.st_uid}). Set {ENV_VAR} to a "
                "directory of your own.")
        logger.debug("graph cache: %s is shared; using %s", directory, private)
        directory = private
    return _Directory(directory, _secret(directory))


def _secret(directory: str) -> bytes:
    """The directory's HMAC key: read, or created atomically (a whole file or none)."""
    path = os.path.join(directory, SECRET)
    for _ in range(2):
        try:
            fd = open_regular(path, "the graph cache's secret", follow_symlinks=False)
        except FileNotFoundError:
            fd_new, temporary = tempfile.mkstemp(prefix=".secret.", dir=directory)  # 0600
            try:
                with os.fdopen(fd_new, "wb") as f:
                    f.write(os.urandom(SECRET_BYTES))
                    f.flush()
                    os.fsync(f.fileno())
                with contextlib.suppress(FileExistsError):  # another process made it first
                    os.link(temporary, path)
            finally:
                os.unlink(temporary)
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            secret = f.read(SECRET_BYTES + 1)
        if st.st_uid != _user() or st.st_mode & 0o077 or len(secret) != SECRET_BYTES:
            raise OSError(f"its secret {path!r} is not a {SECRET_BYTES}-byte file that only "
                          f"this user can read (owner {st.st_uid}, mode "
                          f"{stat.filemode(st.st_mode)}); delete the directory to start afresh.")
        return secret
    raise OSError(f"cannot create the secret {path!r}")


def _entry_path(directory: str, key: str) -> str:
    return os.path.join(directory, f"{key}.npz")


def _mac(secret: bytes, key: str, payload: bytes) -> bytes:
    return hmac.new(secret, MAGIC + key.encode() + b"\0" + payload, hashlib.sha256).digest()


# ------------------------------------------------------------------------------------ key
@functools.lru_cache(maxsize=1)
def versions() -> dict:
    try:
        project = importlib.metadata.version("cstorch-jax")
    except importlib.metadata.PackageNotFoundError:
        project = "unknown"
    return {"format": FORMAT, "torch": torch.__version__, "jax": jax.__version__,
            "jaxlib": importlib.metadata.version("jaxlib"), "python": sys.version,
            "project": project}


def _torch_modes() -> list:
    """torch's global settings a trace can depend on. An active function or dispatch mode
    (``with SomeTorchFunctionMode():`` around the step) rewrites ops in ways we cannot key."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    if _get_current_function_mode_stack() or _get_current_dispatch_mode_stack():
        raise fingerprint.NotCacheable("a torch function or dispatch mode is active")
    return [str(torch.get_default_dtype()), str(torch.get_default_device()),
            torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.are_deterministic_algorithms_enabled(), torch.is_autocast_enabled("cpu"),
            str(torch.get_autocast_dtype("cpu"))]


def process_inputs() -> dict:
    """What a step can read from the process rather than from its objects: the command
    line, the environment (less ``IGNORED_ENVIRONMENT``) and the working directory (what
    relative paths mean)."""
    return {"argv": list(sys.argv),
            "environment": {k: v for k, v in sorted(os.environ.items())
                            if k not in IGNORED_ENVIRONMENT},
            "cwd": os.getcwd()}


def _tensor_signature(t: torch.Tensor) -> list:
    # The plain class: whether DeviceState has guarded a tensor yet must not change the key.
    return [list(t.shape), list(t.stride()), str(t.dtype), t.requires_grad,
            plain_type(t).__name__]


def step_key(fingerprinter: fingerprint.Fingerprinter, slots, inputs, selection,
             decompositions, extra: str) -> str:
    """The cache key of capturing a step over ``slots`` and ``inputs`` (see module docstring);
    ``selection`` is plain data (JSON), the caller's rendering of what selects a program.
    Raises ``fingerprint.NotCacheable`` if some part cannot be fingerprinted."""
    fingerprinter.add("decompositions", {str(op): fn for op, fn in (decompositions or {}).items()})
    fingerprinter.add("torch's global module hooks", fingerprint.torch_global_hooks())
    fingerprinter.add("the process", process_inputs())
    fingerprinter.add("library attributes replaced by user code",
                      fingerprint.replaced_library_attributes())
    index_of, layout = {}, []
    for slot in slots:
        tensor = slot.get()
        unique = index_of.setdefault(id(tensor), len(index_of))
        layout.append([slot.name or repr(slot.key), unique] + _tensor_signature(tensor))
    parts = [versions(), fingerprinter.hexdigest(), layout,
             [_tensor_signature(t) for t in inputs], selection, _torch_modes(), extra]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------------- files
@functools.lru_cache(maxsize=1)
def _installed_dirs() -> tuple:
    dirs = set(site.getsitepackages()) | {site.getusersitepackages()}
    dirs |= {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    return tuple(os.path.abspath(d) + os.sep for d in dirs)


@functools.lru_cache(maxsize=8192)
def _content_digest(path: str, size: int, mtime_ns: int) -> str:
    del size, mtime_ns  # part of the lru key: a changed file is hashed again
    with os.fdopen(open_regular(path), "rb") as f:
        return "sha256:" + hashlib.sha256(f.read()).hexdigest()


def _file_digest(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "absent"
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
        return "not a source file"
    if path.startswith(_installed_dirs()):
        return f"stat:{st.st_size}:{st.st_mtime_ns}"
    try:
        return _content_digest(path, st.st_size, st.st_mtime_ns)
    except OSError:
        return "not a source file"


def loaded_source_files() -> set:
    """The files of every loaded module outside torch, jax, jaxlib and the standard library."""
    files = set()
    for module in list(sys.modules.values()):
        filename = getattr(module, "__file__", None)
        if isinstance(filename, str) and os.path.isabs(filename) and \
                not fingerprint.is_library_file(filename):
            files.add(os.path.abspath(filename))
    return files


def source_files(extra=(), read=()) -> dict:
    """``{path: digest}`` of ``loaded_source_files()``, ``extra`` (e.g. the fingerprint's
    files, which may belong to no registered module) and ``read`` (files the trace opened;
    these may be absent: opening one failed, and creating it must be a miss). Raises
    NotCacheable if one of them cannot be read as a regular file (code loaded from a zip, a
    deleted module, a FIFO or device read by the step): a change would go unseen."""
    paths = loaded_source_files() | set(extra)
    files = {path: _file_digest(path) for path in sorted(paths | set(read))}
    unreadable = [path for path, digest in files.items()
                  if ":" not in digest and not (digest == "absent" and path not in paths)]
    if unreadable:
        raise fingerprint.NotCacheable(f"the step depends on {unreadable[0]}, which cannot "
                                       "be read as a regular file")
    return files


def _stale_file(stored: dict, extra=()) -> str | None:
    """The first reason the stored file list does not describe the running program."""
    for path in sorted(loaded_source_files() | set(extra)):
        if path not in stored:
            return f"{path} is loaded now but was not when the entry was stored"
    for path, digest in stored.items():
        if _file_digest(path) != digest:
            return f"{path} changed"
    return None


def _global_random_states():
    """The states of Python's and numpy's global random generators."""
    return random.getstate(), np.random.get_state(legacy=False)


class CaptureRecord:
    """What a capture did besides building the graph: ``read``, the files one thread opened
    through Python (``open``, ``os.open``, ``io.open_code``) while ``watching_capture`` was
    active; ``problem``, set if it opened a file for writing or by descriptor, or drew
    numbers from Python's or numpy's global random generator (a hit would not repeat that,
    and the numbers drawn are baked into the graph)."""

    def __init__(self):
        self.thread = threading.get_ident()
        self.read: set = set()
        self.problem: str | None = None


_records: list = []  # active CaptureRecords, innermost last
_audit_hook_added = False
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def _audit(event, args):
    if not _records or event != "open":
        return
    record = _records[-1]
    if record.thread != threading.get_ident():
        return
    try:  # an audit hook must not raise: that would fail the user's open()
        path, mode, flags = args
        if isinstance(path, int):
            record.problem = record.problem or f"the step opened file descriptor {path}"
            return
        path = os.path.abspath(os.fsdecode(path))
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) \
            else bool((flags or 0) & _WRITE_FLAGS)
        if writes:
            record.problem = record.problem or f"the step opened {path} for writing"
        else:
            record.read.add(path)
    except Exception as err:  # noqa: BLE001
        record.problem = record.problem or f"an open() the cache could not follow ({err})"


@contextlib.contextmanager
def watching_capture():
    """A ``CaptureRecord`` of the block: the files the current thread opens through Python
    (e.g. a config file the step reads while it is traced: their contents then belong to
    the entry, checked on every load) and whether it drew global random numbers. The audit
    hook is added once, the first time a cache is used (``sys.addaudithook`` cannot remove
    it; it returns at once when nothing records)."""
    global _audit_hook_added
    if not _audit_hook_added:
        sys.addaudithook(_audit)
        _audit_hook_added = True
    record = CaptureRecord()
    random_before = _global_random_states()
    _records.append(record)
    try:
        yield record
    finally:
        _records.remove(record)
    python_after, numpy_after = _global_random_states()
    if python_after != random_before[0] or not _same_numpy_state(random_before[1], numpy_after):
        record.problem = record.problem or "the step drew numbers from Python's or numpy's " \
            "global random generator while it was traced"


def _same_numpy_state(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True, default=lambda x: np.asarray(x).tolist()) == \
        json.dumps(b, sort_keys=True, default=lambda x: np.asarray(x).tolist())


# -------------------------------------------------------------------------------- encoding
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
        self.optimizer_specs: dict = {}

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
            return {"tensor": [str(v.dtype).removeprefix("torch."), list(v.shape),
                               list(v.stride())]}
        if isinstance(v, (list, tuple)):
            return {"tuple" if isinstance(v, tuple) else "list": [self.meta(x) for x in v]}
        if type(v) in (type(None), bool, int, float):
            return v
        raise fingerprint.NotCacheable(f"node metadata of type {type(v).__name__}")

    def node(self, n: torch.fx.Node) -> list:
        if n.op in ("placeholder", "output"):
            target = None
        elif n.op == "get_attr":
            target = self.constant(getattr(self.gm, n.target))
        elif n.op == "call_function" and n.target is operator.getitem:
            target = "getitem"
        elif n.op == "call_function" and n.target is _OPTAX_UPDATE:
            raise fingerprint.NotCacheable("an optax transformation (a Python object)")
        elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            target = _op_name(n.target)
            if n.target is _OPTIMIZER_STEP:  # its key names a spec registered in-process
                spec = torch_ops.optimizer_spec(n.args[0])
                self.optimizer_specs[n.args[0]] = [spec.name, spec.static_json,
                                                   list(spec.dynamic)]
        else:
            raise fingerprint.NotCacheable(f"a graph node {n.op} {n.target}")
        encoded = [n.op, target, self.value(list(n.args)),
                   {k: self.value(v) for k, v in n.kwargs.items()}, self.meta(n.meta.get("val"))]
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
        "versions": versions(), "key": key, "files": files, "nodes": nodes,
        "constants": [[str(t.dtype).removeprefix("torch."), list(t.shape)]
                      for t in encoder.constants],
        "used_state": captured.used_state, "written_state": captured.written_state,
        "num_inputs": captured.num_inputs, "output_spec": spec,
        "output_is_tensor": captured.output_is_tensor,
        "output_constants": captured.output_constants, "extras": extras,
        "optimizer_specs": encoder.optimizer_specs,
    }
    text = json.dumps(document, separators=(",", ":"), allow_nan=True)
    return text.encode(), encoder.constants


# -------------------------------------------------------------------------------- decoding
def _check(condition, what):
    if not condition:
        raise CorruptEntry(what)


def _int_list(v, what, limit) -> list:
    _check(isinstance(v, list) and len(v) <= MAX_RANK, f"{what} is not a short list")
    _check(all(type(x) is int and 0 <= x <= limit for x in v), f"{what} holds a bad number")
    return v


def _resolve_op(name):
    if name == "getitem":
        return operator.getitem
    _check(isinstance(name, str) and len(name) < 300, "an op name is not a string")
    namespace, _, rest = name.partition("::")
    op_name, _, overload = rest.partition(".")
    _check(all(_NAME.match(p) and not p.startswith("__") for p in (namespace, op_name, overload))
           and namespace in lowered_namespaces(), f"malformed op name {name[:80]!r}")
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), op_name), overload)
    except (AttributeError, RuntimeError) as err:
        raise CorruptEntry(f"unknown op {name!r}") from err
    _check(isinstance(op, torch._ops.OpOverload) and has_lowering(op),
           f"op {name!r} is not a lowered ATen operator")
    return op


class _Decoder:
    def __init__(self, constants: list):
        self.constants = constants
        self.nodes: list = []

    def value(self, v, depth=0):
        _check(depth < MAX_DEPTH, "arguments nest too deeply")
        if type(v) in _SCALARS:
            return v
        if isinstance(v, list):
            return [self.value(x, depth + 1) for x in v]
        _check(isinstance(v, dict) and len(v) == 1, "an argument of unknown form")
        (tag, x), = v.items()
        if tag == "node":
            _check(type(x) is int and 0 <= x < len(self.nodes), "a reference to a later node")
            return self.nodes[x]
        if tag == "tuple":
            _check(isinstance(x, list), "a malformed tuple")
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
        _check(depth < MAX_DEPTH, "metadata nests too deeply")
        if type(v) in (type(None), bool, int, float):
            return v
        _check(isinstance(v, dict) and len(v) == 1, "metadata of unknown form")
        (tag, x), = v.items()
        _check(isinstance(x, list), "malformed metadata")
        if tag == "tensor":
            _check(len(x) == 3 and x[0] in _DTYPES, "malformed tensor metadata")
            shape = _int_list(x[1], "a shape", MAX_DIM)
            stride = _int_list(x[2], "a stride", MAX_DIM)
            _check(len(shape) == len(stride), "shape and stride differ in rank")
            return torch.empty_strided(shape, stride, dtype=_DTYPES[x[0]], device="meta")
        if tag in ("tuple", "list"):
            items = [self.meta(y, depth + 1) for y in x]
            return tuple(items) if tag == "tuple" else items
        raise CorruptEntry("metadata of unknown form")


def _decode_spec(v) -> pytree.TreeSpec:
    return pytree.tree_structure(_spec_example(v, 0, [0]))


def _spec_example(v, depth, count):
    """A container with the structure ``v`` describes (leaves are 0)."""
    count[0] += 1
    _check(depth < MAX_DEPTH and count[0] < 100_000, "the output structure is too large")
    if v == "*":
        return 0
    _check(isinstance(v, dict) and len(v) == 1, "a malformed output structure")
    (tag, x), = v.items()
    if tag == "none":
        return None
    _check(isinstance(x, list), "a malformed output structure")
    if tag in ("tuple", "list"):
        items = [_spec_example(c, depth + 1, count) for c in x]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        _check(all(isinstance(p, list) and len(p) == 2 and type(p[0]) in (str, int) for p in x),
               "a malformed output dict")
        return {k: _spec_example(c, depth + 1, count) for k, c in x}
    raise CorruptEntry(f"an output container tagged {str(tag)[:40]!r}")


def _read_constants(doc, arrays) -> list:
    specs = doc["constants"]
    _check(isinstance(specs, list) and len(specs) == len(arrays), "constants do not match")
    constants = []
    for (dtype_name, shape), raw in zip(specs, arrays):
        _check(dtype_name in _DTYPES, "a constant of unknown dtype")
        dtype = _DTYPES[dtype_name]
        _int_list(shape, "a constant's shape", MAX_DIM)
        numel = 1
        for d in shape:
            numel *= d
        _check(raw.nbytes == numel * dtype.itemsize, "a constant of the wrong size")
        flat = torch.frombuffer(bytearray(raw.tobytes()), dtype=torch.uint8) if raw.nbytes \
            else torch.empty(0, dtype=torch.uint8)
        constants.append(flat.view(dtype).reshape(shape))
    return constants


def _register_optimizer_specs(specs) -> set:
    """Registers the optimizer specs the graph's ``optimizer_step`` nodes name; each key is
    the content hash of its spec, so a spec that does not hash to its key is refused."""
    _check(isinstance(specs, dict), "malformed optimizer specs")
    for key, spec in specs.items():
        _check(isinstance(spec, list) and len(spec) == 3 and spec[0] in optimizers.OPTIMIZERS
               and isinstance(spec[1], str) and isinstance(spec[2], list)
               and all(isinstance(d, str) for d in spec[2]), "a malformed optimizer spec")
        static = json.loads(spec[1])
        _check(isinstance(static, dict), "a malformed optimizer spec")
        _check(torch_ops.optimizer_key(spec[0], static, spec[2]) == key,
               "an optimizer spec that does not match its key")
    return set(specs)


def decode(doc: dict, arrays: list, state: list, inputs: list):
    """(CapturedStep, extras) from an entry's JSON and constant arrays, for a step over the
    unique ``state`` tensors and ``inputs`` (whose shapes and dtypes its placeholders must
    have). Raises CorruptEntry."""
    num_state = len(state)
    _check(isinstance(doc, dict), "not a JSON object")
    optimizer_keys = _register_optimizer_specs(doc["optimizer_specs"])
    nodes = doc["nodes"]
    _check(isinstance(nodes, list) and 2 <= len(nodes) <= MAX_NODES, "a bad node count")
    decoder = _Decoder(_read_constants(doc, arrays))
    graph = torch.fx.Graph()
    attrs, placeholders, output_seen = {}, 0, False
    for encoded in nodes:
        _check(isinstance(encoded, list) and len(encoded) == 5 and not output_seen,
               "a malformed node")
        op, target, args, kwargs, meta = encoded
        _check(isinstance(args, list) and isinstance(kwargs, dict), "malformed arguments")
        if op == "placeholder":
            _check(placeholders == len(decoder.nodes), "a placeholder after other nodes")
            node = graph.placeholder(f"arg{placeholders}")
            placeholders += 1
        elif op == "get_attr":
            _check(type(target) is int and 0 <= target < len(decoder.constants),
                   "a bad constant")
            name = f"_const{target}"
            attrs[name] = decoder.constants[target]
            node = graph.get_attr(name)
        elif op == "call_function":
            _check(all(isinstance(k, str) and _NAME.match(k) for k in kwargs), "a bad keyword")
            op = _resolve_op(target)
            _check(op is not _OPTAX_UPDATE, "an optax update")
            _check(op is not _OPTIMIZER_STEP or (args and args[0] in optimizer_keys),
                   "an optimizer step without its spec")
            node = graph.call_function(op, tuple(decoder.value(a) for a in args),
                                       {k: decoder.value(v) for k, v in kwargs.items()})
        elif op == "output":
            _check(len(args) == 1 and isinstance(args[0], list) and not kwargs,
                   "a malformed output")
            node = graph.output(decoder.value(args[0]))
            output_seen = True
        else:
            raise CorruptEntry(f"a node of kind {str(op)[:40]!r}")
        node.meta["val"] = decoder.meta(meta)
        decoder.nodes.append(node)
    _check(output_seen, "no output node")

    used, written = doc["used_state"], doc["written_state"]
    num_inputs, is_tensor = doc["num_inputs"], doc["output_is_tensor"]
    constants = doc["output_constants"]
    for name, indices in (("used", used), ("written", written)):
        _check(isinstance(indices, list) and len(set(indices)) == len(indices)
               and all(type(i) is int and 0 <= i < num_state for i in indices),
               f"bad {name} state indices")
    _check(type(num_inputs) is int and placeholders == len(used) + num_inputs
           and num_inputs == len(inputs), "placeholders do not match the state and inputs")
    for node, tensor in zip(decoder.nodes, [state[i] for i in used] + list(inputs)):
        val = node.meta["val"]
        _check(isinstance(val, torch.Tensor) and val.shape == tensor.shape
               and val.dtype == tensor.dtype, "a placeholder of another shape or dtype")
    _check(isinstance(is_tensor, list) and all(type(b) is bool for b in is_tensor)
           and isinstance(constants, list) and len(constants) == len(is_tensor)
           and all(type(c) in _SCALARS and (c is None or not t)
                   for c, t in zip(constants, is_tensor)), "bad output leaves")
    outputs = decoder.nodes[-1].args[0]
    _check(len(outputs) == len(written) + sum(is_tensor)
           and all(isinstance(o, torch.fx.Node) for o in outputs), "bad graph outputs")
    spec = _decode_spec(doc["output_spec"])
    _check(spec.num_leaves == len(is_tensor), "the output structure does not match")
    captured = CapturedStep(
        graph=torch.fx.GraphModule(attrs, graph), used_state=used, written_state=written,
        num_inputs=num_inputs, output_spec=spec, output_is_tensor=is_tensor,
        output_constants=constants)
    return captured, doc["extras"]


# ------------------------------------------------------------------------------ store/load
@dataclasses.dataclass
class Entry:
    captured: CapturedStep
    extras: dict  # the caller's, as stored: validate before use


def load(directory: str, key: str, state: list, inputs: list, extra_files=()) -> Entry | None:
    """The entry stored under ``key`` for a step over the unique ``state`` tensors and
    ``inputs``, or None (a miss: absent, refused, stale or unreadable)."""
    where = _open_directory(directory)
    if where is None:
        return _miss(key, "the cache directory was refused")
    path = _entry_path(where.path, key)
    try:
        payload = _read_authenticated(where, key, path)
        doc, arrays = _read(payload)
        _check(doc.get("versions") == versions(), "written by another version")
        _check(doc.get("key") == key, "stored under another key")
        files = doc.get("files")
        _check(isinstance(files, dict) and all(isinstance(v, str) for v in files.values()),
               "a malformed file list")
        stale = _stale_file(files, extra_files)
        if stale is not None:
            return _miss(key, stale)
        captured, extras = decode(doc, arrays, state, inputs)
    except FileNotFoundError:
        return _miss(key, "no entry")
    except Exception as err:  # noqa: BLE001 - whatever is wrong with an entry, it is a miss
        warnings.warn(f"Ignoring graph cache entry {path} ({type(err).__name__}: "
                      f"{str(err)[:200]}); the step is captured again.", GraphCacheWarning,
                      stacklevel=2)
        return _miss(key, "unreadable")
    jax.monitoring.record_event(EVENT_HIT)
    logger.debug("graph cache hit %s", key)
    return Entry(captured, extras)


def discard(directory: str, key: str) -> None:
    """Removes the entry stored under ``key`` (one that turned out not to work)."""
    where = _open_directory(directory)
    if where is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_entry_path(where.path, key))


def _miss(key, reason):
    jax.monitoring.record_event(EVENT_MISS)
    logger.debug("graph cache miss %s: %s", key, reason)
    return None


def _read_authenticated(where: _Directory, key: str, path: str) -> bytes:
    """The payload of the entry at ``path``, once it is known to be a regular file of this
    user (checked on the open descriptor, before reading) whose HMAC matches."""
    fd = open_regular(path, "graph cache entry", follow_symlinks=False)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        _check(st.st_uid == _user(), f"owned by user id {st.st_uid}, not by this user")
        _check(st.st_size <= MAX_FILE_BYTES, f"{st.st_size} bytes, more than the limit")
        data = f.read(MAX_FILE_BYTES + 1)
    _check(len(data) <= MAX_FILE_BYTES, "more than the limit")
    head = len(MAGIC) + hashlib.sha256().digest_size
    _check(data[:len(MAGIC)] == MAGIC, "not an entry of this format")
    payload = data[head:]
    _check(hmac.compare_digest(data[len(MAGIC):head], _mac(where.secret, key, payload)),
           "its HMAC does not match: it was changed, or written with another secret")
    return payload


def _read(payload: bytes):
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        members = archive.infolist()
        _check(all(m.compress_type == zipfile.ZIP_STORED for m in members), "compressed members")
        _check(sum(m.file_size for m in members) <= MAX_FILE_BYTES, "members too large")
        names = [m.filename for m in members]
        _check(names and names[0] == "entry.npy"
               and names[1:] == [f"c{i}.npy" for i in range(len(names) - 1)],
               "unexpected members")
        for member in members:  # a header must not promise more than its member holds
            with archive.open(member) as f:
                version = np.lib.format.read_magic(f)
                _check(version in ((1, 0), (2, 0)), "an unknown array format")
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read_header(f)
                _check(dtype == np.uint8 and len(shape) == 1
                       and shape[0] <= member.file_size, "an array larger than its member")
    with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
        raw = npz["entry"]
        _check(raw.dtype == np.uint8 and raw.ndim == 1 and raw.nbytes <= MAX_JSON_BYTES,
               "a malformed entry record")
        arrays = [npz[f"c{i}"] for i in range(len(names) - 1)]
    _check(all(a.dtype == np.uint8 and a.ndim == 1 for a in arrays), "malformed constants")
    return json.loads(raw.tobytes().decode("utf-8")), arrays


def store(directory: str, key: str, captured: CapturedStep, extras: dict,
          extra_files=(), read_files=()) -> bool:
    """Writes an entry atomically; False (and nothing written) if the step is not cacheable
    or the directory is refused or not writable: the cache must never stop training.
    ``read_files``: the files the trace opened (``watching_capture``)."""
    where = _open_directory(directory)
    if where is None:
        return False
    try:
        text, constants = encode(captured, extras, source_files(extra_files, read_files), key)
    except fingerprint.NotCacheable as err:
        logger.debug("graph cache: not storing %s: %s", key, err)
        return False
    if len(text) > MAX_JSON_BYTES or sum(t.nbytes for t in constants) > MAX_FILE_BYTES // 2:
        logger.debug("graph cache: not storing %s: too large", key)
        return False
    arrays = {"entry": np.frombuffer(text, dtype=np.uint8)}
    for i, t in enumerate(constants):
        arrays[f"c{i}"] = t.reshape(-1).view(torch.uint8).numpy() if t.numel() \
            else np.zeros(0, np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    payload = buffer.getvalue()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=where.path)
        try:
            with os.fdopen(fd, "wb") as f:  # mkstemp: 0600, this user's
                f.write(MAGIC + _mac(where.secret, key, payload) + payload)
            os.replace(tmp, _entry_path(where.path, key))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as err:
        logger.debug("graph cache: cannot write %s: %s", where.path, err)
        return False
    jax.monitoring.record_event(EVENT_STORE)
    logger.debug("graph cache stored %s", key)
    return True
