"""The cache directory and its entries: where they live, who may have written them, and
reading, writing and removing one (``load``, ``store``, ``discard``).

An entry is one file ``<key>.npz``: ``MAGIC``, an HMAC-SHA256 of the key and the payload,
then the payload (``codec.pack``). It is written to a temporary name and renamed, so
readers see a whole entry or none.

**Integrity.** The directory must be this user's and not writable by others (a new one is
made 0700; in a shared directory such as a 1777 one, a private subdirectory
``cstorch-graphs-uid<N>`` is used instead; if that is not possible the cache is off, with
one warning). It holds a random per-user secret (``SECRET``, 0600, created atomically);
every entry carries the HMAC of its key and content under that secret. An entry is opened
with ``O_NOFOLLOW | O_NONBLOCK`` and checked with ``fstat`` before a byte is read: a
symbolic link, a FIFO or device, a file of another owner, or one larger than
``codec.MAX_FILE_BYTES`` is refused, and so is any entry whose HMAC does not match (edited,
re-zipped, copied from elsewhere). An entry that is refused, truncated, corrupt, of another
format, names an op that is not lowered, or whose placeholders do not have the shapes and
dtypes of the current state and inputs, is a miss with a one-line ``GraphCacheWarning``; a
missing entry is a silent miss.

Hits, misses and stores are reported as ``jax.monitoring`` events (``EVENT_*``) and logged
at debug level by the ``jax_backend.graph_cache`` logger; misses as warnings with the
diagnostics on (``explain.py``). ``key`` is a ``key.StepKey`` (or its digest: a key without
parts, as tests give): a miss for want of an entry then says which parts differ from the
step's stored entries, and a store records its parts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import os
import stat
import threading
import warnings

import jax
import jax.monitoring

from jax_backend import config
from jax_backend.atomic_files import write_file
from jax_backend.capture import CapturedStep
from jax_backend.config import graph_cache as setting
from jax_backend.graph_cache import codec, explain, fingerprint
from jax_backend.graph_cache.codec import check
from jax_backend.graph_cache.explain import logger
from jax_backend.graph_cache.sources import source_files, stale_file
from jax_backend.regular_files import open_regular
from jax_backend.user_frames import warn

ENV_VAR = setting.env_var
MAGIC = b"cstorch-graph-cache 2\n"
SECRET = ".hmac-secret"
SECRET_BYTES = 32

EVENT_HIT = "/cstorch_jax/graph_cache/hit"
EVENT_MISS = "/cstorch_jax/graph_cache/miss"
EVENT_STORE = "/cstorch_jax/graph_cache/store"


class GraphCacheWarning(UserWarning):
    """A graph cache entry could not be used (corrupt, truncated, foreign or refused); the
    step is captured again and the entry replaced."""


# ------------------------------------------------------------------------------ directory
def default_directory() -> str | None:
    """The cache directory the environment asks for, or None (the default: off)."""
    return config.cache_directory(setting, "graphs")


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
                warn(f"The graph cache is off: {err}", GraphCacheWarning)
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
                "directory of your own."
            )
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
            with contextlib.suppress(FileExistsError):  # another process made it first
                write_file(path, os.urandom(SECRET_BYTES), mode=0o600, durable=True, replace=False)
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            secret = f.read(SECRET_BYTES + 1)
        if st.st_uid != _user() or st.st_mode & 0o077 or len(secret) != SECRET_BYTES:
            raise OSError(
                f"its secret {path!r} is not a {SECRET_BYTES}-byte file that only "
                f"this user can read (owner {st.st_uid}, mode "
                f"{stat.filemode(st.st_mode)}); delete the directory to start afresh."
            )
        return secret
    raise OSError(f"cannot create the secret {path!r}")


def _entry_path(directory: str, key: str) -> str:
    return os.path.join(directory, f"{key}.npz")


def mac(secret: bytes, key: str, payload: bytes) -> bytes:
    """The HMAC an entry of ``key`` and ``payload`` carries under the directory's secret."""
    return hmac.new(secret, MAGIC + key.encode() + b"\0" + payload, hashlib.sha256).digest()


# ------------------------------------------------------------------------------ store/load
@dataclasses.dataclass
class Entry:
    captured: CapturedStep
    extras: dict  # the caller's, as stored: validate before use


def load(directory: str, key, state: list, inputs: list, extra_files=()) -> Entry | None:
    """The entry stored under ``key`` (a ``StepKey`` or its digest) for a step over the
    unique ``state`` tensors and ``inputs``, or None (a miss: absent, refused, stale or
    unreadable)."""
    where = _open_directory(directory)
    if where is None:
        return _miss(key, "the cache directory was refused")
    path = _entry_path(where.path, str(key))
    try:
        payload = _read_authenticated(where, str(key), path)
        doc, arrays = codec.unpack(payload)
        stale = stale_file(codec.files_of(doc, str(key)), extra_files)
        if stale is not None:
            return _miss(key, stale)
        captured, extras = codec.decode(doc, arrays, state, inputs)
    except FileNotFoundError:
        return _miss(key, explain.explain(where.path, where.secret, key))
    except Exception as err:  # noqa: BLE001 - whatever is wrong with an entry, it is a miss
        warnings.warn(
            f"Ignoring graph cache entry {path} ({type(err).__name__}: "
            f"{str(err)[:200]}); the step is captured again.",
            GraphCacheWarning,
            stacklevel=2,
        )
        return _miss(key, "unreadable")
    jax.monitoring.record_event(EVENT_HIT)
    logger.debug("graph cache hit %s%s", key, _for_step(key))
    return Entry(captured, extras)


def discard(directory: str, key: str) -> None:
    """Removes the entry stored under ``key`` (one that turned out not to work)."""
    where = _open_directory(directory)
    if where is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_entry_path(where.path, key))


def _for_step(key) -> str:
    step = getattr(key, "step", None)
    return f" for {step}" if step else ""


def _miss(key, reason):
    jax.monitoring.record_event(EVENT_MISS)
    explain.report("graph cache miss %s%s: %s", str(key)[:16], _for_step(key), reason)
    return None


def _read_authenticated(where: _Directory, key: str, path: str) -> bytes:
    """The payload of the entry at ``path``, once it is known to be a regular file of this
    user (checked on the open descriptor, before reading) whose HMAC matches."""
    limit = codec.MAX_FILE_BYTES
    fd = open_regular(path, "graph cache entry", follow_symlinks=False)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        check(st.st_uid == _user(), f"owned by user id {st.st_uid}, not by this user")
        check(st.st_size <= limit, f"{st.st_size} bytes, more than the limit")
        data = f.read(limit + 1)
    check(len(data) <= limit, "more than the limit")
    head = len(MAGIC) + hashlib.sha256().digest_size
    check(data[: len(MAGIC)] == MAGIC, "not an entry of this format")
    payload = data[head:]
    check(
        hmac.compare_digest(data[len(MAGIC) : head], mac(where.secret, key, payload)),
        "its HMAC does not match: it was changed, or written with another secret",
    )
    return payload


def store(
    directory: str, key, captured: CapturedStep, extras: dict, extra_files=(), read_files=()
) -> bool:
    """Writes an entry atomically under ``key`` (a ``StepKey``, whose parts its step's
    record keeps, or its digest); False (and nothing written) if the step is not cacheable
    or the directory is refused or not writable: the cache must never stop training.
    ``read_files``: the files the trace opened (``watching_capture``)."""
    where = _open_directory(directory)
    if where is None:
        return False
    digest = str(key)
    try:
        payload = codec.pack(captured, extras, source_files(extra_files, read_files), digest)
    except fingerprint.NotCacheable as err:
        explain.report("graph cache: not storing %s%s: %s", digest, _for_step(key), err)
        return False
    try:  # 0600: this user's alone
        write_file(
            _entry_path(where.path, digest),
            MAGIC + mac(where.secret, digest, payload) + payload,
            mode=0o600,
        )
    except OSError as err:
        logger.debug("graph cache: cannot write %s: %s", where.path, err)
        return False
    explain.record(where.path, where.secret, key)
    jax.monitoring.record_event(EVENT_STORE)
    logger.debug("graph cache stored %s%s", digest, _for_step(key))
    return True
