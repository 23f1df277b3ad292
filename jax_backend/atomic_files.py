"""Publishing a file (or a directory) in one step, for every writer whose output others read.

A checkpoint, a graph cache entry (and the cache's secret) and an exported step are each
written under a temporary name beside their final path (the same directory: the same
filesystem, so the rename is atomic) and then renamed over it (``os.replace``). A reader sees
the old file or the whole new one, never a part; writers racing on one path each publish a
whole file (the last rename wins); and a failure at any point before the rename (an
exception, a full disk) removes the temporary and leaves the old file as it was.

``AtomicFile`` is the writer; ``write_file`` writes bytes with it in one call;
``staged_directory`` does the same for a directory (an exported step).

**Without replacing.** ``rename_no_replace`` publishes only where ``path`` does not exist,
even against a concurrent writer (``cstorch.save(..., exist_ok=False)``, the cache's secret):
``os.link`` (fails if the name exists), else ``renameat2(RENAME_NOREPLACE)``, else an
exclusive reservation of the name (an empty file for a moment) replaced by the file.

**Temporary names** are ``<path>.<8 hex digits>.tmp`` (``temp_name``, ``is_temp_name``). A
process killed while writing leaves its temporary behind; a writer that passes ``lock=True``
holds a lock on its temporary while it lives, so ``remove_stray_temp_files`` (run by the next
write to the same path) can tell a dead writer's leftover from a live writer's file.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import os
import secrets
import shutil
import time
from typing import Literal

from jax_backend.regular_files import open_regular

_TEMP_TAG_DIGITS = 8
_HEX = "0123456789abcdef"


def temp_name(path: str) -> str:
    """A fresh temporary name for ``path``: ``<path>.<8 hex digits>.tmp``."""
    return f"{path}.{secrets.token_hex(_TEMP_TAG_DIGITS // 2)}.tmp"


def is_temp_name(path) -> bool:
    """Whether ``path`` is named like a temporary file of this module (``<x>.<8 hex>.tmp``)."""
    stem, _, suffix = os.path.basename(os.fspath(path)).rpartition(".")
    tag = stem.rpartition(".")[2]
    return suffix == "tmp" and len(tag) == _TEMP_TAG_DIGITS and all(c in _HEX for c in tag)


def temp_files(path: str) -> list:
    """The temporary files of writes to ``path`` that exist now (live or left behind)."""
    return glob.glob(f"{glob.escape(path)}.{'[0-9a-f]' * _TEMP_TAG_DIGITS}.tmp")


#: A temporary file younger than this may belong to a writer that has created it but not
#: locked it yet; it is never removed.
STRAY_MIN_AGE_SECONDS = 10.0


def remove_stray_temp_files(path: str) -> list:
    """Deletes the temporary files of writes to ``path`` whose writer is gone (its lock is
    free and the file is older than ``STRAY_MIN_AGE_SECONDS``); returns their names. Only
    for paths whose writers all pass ``lock=True``."""
    removed = []
    for temp in temp_files(path):
        try:
            if time.time() - os.stat(temp).st_mtime < STRAY_MIN_AGE_SECONDS:
                continue
            # not os.open(temp): a FIFO planted under that name would block the writer
            fd = open_regular(temp, "temporary file", follow_symlinks=False)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live writer holds it
        else:
            try:
                os.unlink(temp)
                removed.append(temp)
            except OSError:
                pass
        finally:
            os.close(fd)
    return removed


def _create_fresh(new_name, create):
    """``(name, create(name))`` for the first of up to 100 fresh names ``new_name()`` that
    ``create`` (an exclusive create) does not find taken: another writer may draw the same."""
    for _ in range(99):
        name = new_name()
        try:
            return name, create(name)
        except FileExistsError:
            pass
    name = new_name()
    return name, create(name)  # the last try: its FileExistsError goes to the caller


def fsync_directory(directory: str) -> None:
    """Makes a rename in ``directory`` durable, where the filesystem allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_NO_HARD_LINKS = (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK)


def _rename_noreplace(source: str, target: str) -> bool:
    """``renameat2(..., RENAME_NOREPLACE)``; False where the system does not offer it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    result = renameat2(
        _AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE
    )
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), target)


def rename_no_replace(source: str, target: str) -> None:
    """Renames ``source`` to ``target`` unless ``target`` exists, even if another writer
    creates it meanwhile: then ``FileExistsError`` (naming ``target``) and ``source`` stays.
    A hard link (then ``source`` is removed), else ``renameat2(RENAME_NOREPLACE)``, else an
    exclusive reservation of the name replaced by ``source`` (a reader may see an empty
    file there for that moment)."""
    try:
        os.link(source, target)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), target) from None
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
    else:
        os.unlink(source)
        return
    # No hard links on this filesystem: an atomic rename that refuses to replace.
    try:
        if _rename_noreplace(source, target):
            return
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), target) from None
    # Last resort: reserve the name exclusively, then move the file over the reservation.
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), target) from None
    os.replace(source, target)


class AtomicFile:
    """A new file for ``path``, written through ``fd`` (read-write, close-on-exec) under
    ``temp_path`` and published at ``path`` by ``publish``; ``discard`` (or an exception in
    a ``with`` block) removes it instead. ``mode`` is the new file's (less the umask);
    ``path`` itself is not touched before ``publish``. ``lock``: hold an exclusive ``flock``
    on the file while it is written (``remove_stray_temp_files`` then leaves it alone),
    turned into a shared one before it is published, so that readers that lock the file
    they open (HDF5) can open it at once."""

    def __init__(self, path, *, mode: int = 0o600, lock: bool = False):
        self.path = os.fspath(path)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self.temp_path, self.fd = _create_fresh(
            lambda: temp_name(self.path), lambda name: os.open(name, flags, mode)
        )
        self.published = False
        self.locked = lock
        if lock:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX)
            except BaseException:
                self.discard()
                raise

    def publish(self, rename=os.replace, *, durable: bool = False) -> None:
        """Renames the file to ``path`` with ``rename(temp_path, path)`` (``os.replace`` by
        default; ``rename_no_replace`` for a writer that must not replace an existing file)
        and closes it. ``durable``: the data and the rename are synced to disk (``fsync``)
        first and after. If ``rename`` raises, the temporary file stays, for the caller to
        keep or ``discard``."""
        try:
            if durable:
                os.fsync(self.fd)
            if self.locked:  # still tells later writers this file is not a leftover
                fcntl.flock(self.fd, fcntl.LOCK_SH)
            rename(self.temp_path, self.path)
            self.published = True
        finally:
            self.close()
        if durable:
            fsync_directory(os.path.dirname(os.path.abspath(self.path)))

    def close(self) -> None:
        """Closes the descriptor (releasing any ``flock`` on it); idempotent."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def discard(self) -> None:
        """Removes the temporary file, unless it was published, and closes it."""
        try:
            if not self.published:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.temp_path)
        finally:
            self.close()

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        """Publishes (``os.replace``) on a normal exit, discards after an exception."""
        if exc_type is None and not self.published:
            try:
                self.publish()
            except BaseException:
                self.discard()
                raise
        else:
            self.discard()
        return False


def write_file(
    path, data: bytes, *, mode: int = 0o600, durable: bool = False, replace: bool = True
) -> None:
    """Replaces ``path`` with a file holding ``data`` in one step (see ``AtomicFile``);
    on any failure the old file stays and the temporary one is removed. ``replace=False``
    publishes only where ``path`` does not exist (``rename_no_replace``), else raises
    ``FileExistsError``."""
    new = AtomicFile(path, mode=mode)
    try:
        with os.fdopen(new.fd, "wb", closefd=False) as f:
            f.write(data)
        new.publish(os.replace if replace else rename_no_replace, durable=durable)
    except BaseException:
        new.discard()
        raise


@contextlib.contextmanager
def staged_directory(path, *, prefix: str = ".staging-"):
    """A new empty directory beside ``path`` (mode 0777 less the umask, as ``mkdir``
    makes), renamed to ``path`` when the block ends normally (``path`` must then be absent
    or an empty directory: a block that replaces an old one removes it last) and removed
    with all it holds when the block raises."""
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    # mkdir applies the umask itself; reading it would mean setting it, process-wide, for a
    # moment (another thread's files made then would get mode 0666/0777).
    staging, _ = _create_fresh(
        lambda: os.path.join(parent, f"{prefix}{secrets.token_hex(8)}"),
        lambda name: os.mkdir(name, 0o777),
    )
    try:
        yield staging
        os.replace(staging, path)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging)
