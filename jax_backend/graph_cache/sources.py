"""The files an entry depends on, and what a capture does besides building its graph.

**The files** are checked on load (``stale_file``): every loaded module outside torch, jax,
jaxlib and the standard library is listed in the entry with the sha256 of its bytes
(installed packages under site-packages: size and modification time), and so is every file
opened through Python while the step was traced (``watching_capture``: a config or data file
read by ``open``, ``json``, ``numpy``); any difference, or a module now loaded that the entry
does not list, is a miss. A capture that opens a file for writing, a FIFO or a device, or
draws numbers from Python's or numpy's global random generator, is not stored. This covers
every file whose code could have run during the capture (this project's included) without
tracing the capture itself: recording executed code with ``sys.settrace``/``cProfile`` was
measured to double capture time, which every first run would pay.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import site
import stat
import sys
import sysconfig
import threading

import numpy as np

from jax_backend.graph_cache import fingerprint
from jax_backend.regular_files import open_regular

#: A larger file is not hashed: it is no source file.
MAX_SOURCE_BYTES = 512 * 1024 * 1024


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
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SOURCE_BYTES:
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
        if (
            isinstance(filename, str)
            and os.path.isabs(filename)
            and not fingerprint.is_library_file(filename)
        ):
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
    unreadable = [
        path
        for path, digest in files.items()
        if ":" not in digest and not (digest == "absent" and path not in paths)
    ]
    if unreadable:
        raise fingerprint.NotCacheable(
            f"the step depends on {unreadable[0]}, which cannot be read as a regular file"
        )
    return files


def stale_file(stored: dict, extra=()) -> str | None:
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
        writes = (
            any(c in mode for c in "wax+")
            if isinstance(mode, str)
            else bool((flags or 0) & _WRITE_FLAGS)
        )
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
        record.problem = (
            record.problem
            or "the step drew numbers from Python's or numpy's "
            "global random generator while it was traced"
        )


def _same_numpy_state(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True, default=lambda x: np.asarray(x).tolist()) == json.dumps(
        b, sort_keys=True, default=lambda x: np.asarray(x).tolist()
    )
