"""Publishing a file (or a directory) in one step, for every writer whose output others read.

A checkpoint, a graph cache entry and an exported step are each written under a temporary
name beside their final path (the same directory: the same filesystem, so the rename is
atomic) and then renamed over it (``os.replace``). A reader sees the old file or the whole
new one, never a part; writers racing on one path each publish a whole file (the last
rename wins); and a failure at any point before the rename (an exception, a full disk)
removes the temporary and leaves the old file as it was.

``AtomicFile`` is the writer; ``write_file`` writes bytes with it in one call;
``staged_directory`` does the same for a directory (an exported step).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil


def temp_name(path: str) -> str:
    """A fresh temporary name for ``path``: ``<path>.<8 hex digits>.tmp`` (the checkpoint
    writer finds the leftovers of killed saves by this pattern)."""
    return f"{path}.{secrets.token_hex(4)}.tmp"


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


class AtomicFile:
    """A new file for ``path``, written through ``fd`` (read-write, close-on-exec) under
    ``temp_path`` and published at ``path`` by ``publish``; ``discard`` (or an exception in
    a ``with`` block) removes it instead. ``mode`` is the new file's (less the umask);
    ``path`` itself is not touched before ``publish``."""

    def __init__(self, path, *, mode: int = 0o600):
        self.path = os.fspath(path)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self.temp_path, self.fd = _create_fresh(lambda: temp_name(self.path),
                                                lambda name: os.open(name, flags, mode))
        self.published = False

    def publish(self, rename=os.replace, *, durable: bool = False) -> None:
        """Renames the file to ``path`` with ``rename(temp_path, path)`` (``os.replace`` by
        default; a writer that must not replace an existing file passes its own) and closes
        it. ``durable``: the data and the rename are synced to disk (``fsync``) first and
        after. If ``rename`` raises, the temporary file stays, for the caller to keep or
        ``discard``."""
        try:
            if durable:
                os.fsync(self.fd)
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

    def __exit__(self, exc_type, exc, tb) -> bool:
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


def write_file(path, data: bytes, *, mode: int = 0o600, durable: bool = False) -> None:
    """Replaces ``path`` with a file holding ``data`` in one step (see ``AtomicFile``);
    on any failure the old file stays and the temporary one is removed."""
    new = AtomicFile(path, mode=mode)
    try:
        with os.fdopen(new.fd, "wb", closefd=False) as f:
            f.write(data)
        new.publish(durable=durable)
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
    staging, _ = _create_fresh(lambda: os.path.join(parent, f"{prefix}{secrets.token_hex(8)}"),
                               lambda name: os.mkdir(name, 0o777))
    try:
        yield staging
        os.replace(staging, path)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging)
