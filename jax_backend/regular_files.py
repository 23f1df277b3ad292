"""Opening a file for reading only if it is a regular file: never a FIFO, device or directory.

Opening a FIFO for reading blocks until a writer appears (forever, if none does); reading
``/dev/zero`` never ends. A path handed to a loader (a checkpoint, an exported step, a graph
cache entry) is untrusted, so every reader opens it here first: ``os.open`` with
``O_NONBLOCK`` returns at once whatever the path names, ``fstat`` on that descriptor says what
was actually opened (no race with a rename in between), and anything but a regular file is
refused with ``NotARegularFileError`` before a byte is read. ``O_NONBLOCK`` is cleared again
for a regular file (it has no effect on one anyway).

The exported-step loader (``exported.py``) keeps its own copy of this check: it must run
where this package is not installed.
"""

from __future__ import annotations

import fcntl
import os
import stat

from jax_backend.errors import CstorchError, CstorchValueError


class NotARegularFileError(CstorchError, OSError):
    """A path a reader was given names a FIFO, socket, device or directory."""


def describe_mode(mode: int) -> str:
    """What kind of file ``st_mode`` describes, in words."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path, what: str = "file", *, follow_symlinks: bool = True) -> int:
    """A read-only descriptor of ``path`` (blocking mode, close-on-exec), which is a regular
    file; ``NotARegularFileError`` naming ``what`` and the kind of file otherwise.
    ``follow_symlinks=False`` refuses a symbolic link too (``O_NOFOLLOW``)."""
    path = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as error:
        if not follow_symlinks and os.path.islink(path):
            raise NotARegularFileError(
                f"{what} is a symbolic link, which is not followed here: '{path}'"
            ) from None
        _refuse_unopenable(path, what, follow_symlinks, error)
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFileError(
                f"{what} is {describe_mode(mode)}, not a regular file: '{path}'. Only regular "
                "files are read (a pipe or a device could block or never end); pass the path "
                "of the file itself."
            )
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_unopenable(path: str, what: str, follow_symlinks: bool, error: OSError) -> None:
    """A path that cannot even be opened because of what it is (a socket: ENXIO) is refused
    as such, like the kinds ``fstat`` catches; other errors (missing, no permission) stay."""
    try:
        mode = os.stat(path, follow_symlinks=follow_symlinks).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        raise NotARegularFileError(
            f"{what} is {describe_mode(mode)}, not a regular file: '{path}'. Only regular "
            "files are read; pass the path of the file itself."
        ) from error


def open_regular_file(path, what: str = "file", mode: str = "rb", **kwargs):
    """``open_regular`` as a Python file object (``mode`` "rb" or "r")."""
    if mode not in ("r", "rb"):
        raise CstorchValueError(f"open_regular_file reads only; got mode {mode!r}")
    return os.fdopen(open_regular(path, what), mode, **kwargs)


def check_regular(path, what: str = "file") -> None:
    """Raises ``NotARegularFileError`` unless ``path`` is a regular file, for readers that
    open the path themselves (HDF5, ``torch.load``): without blocking, and without reading."""
    os.close(open_regular(path, what))
