"""The HDF5 container of a version-0.5 checkpoint: its layout, writes and lazy reads.

Layout (cerebras-pytorch 2.10's), all at the root group ``/``:

* one dataset per array-valued leaf, named by its dotted key. Non-scalar datasets are chunked and
  LZ4-compressed (hdf5plugin filter 32004, options ``(0,)``); 0-d and empty ones are contiguous.
  Without the LZ4 filter (the optional ``hdf5plugin`` package is not installed) datasets are
  written contiguous and uncompressed, after one warning: any HDF5 reader reads them, and
  reading an LZ4-compressed file then raises an error naming the package;
  Its attributes repeat the leaf's metadata and carry ``__NUMPY__=True``;
* one empty float32 dataset (``h5py.Empty("f")``) per pickled leaf, whose ``__BYTES__``
  attribute holds the pickle as ``numpy.void``;
* root attributes ``__spec__``, ``__version__`` (float64 0.5), ``__cstorch_version__``, one
  ``"<key>.__metadata__"`` JSON string per leaf and, written last, ``__SUCCESS__=True``.

Chunks hold whole trailing rows and are at most 1 MiB: that is HDF5's default chunk cache size,
and rows that are contiguous in memory let the filter pipeline stream without reshuffling
(measured here: 2-3 GiB/s read, ~2 GiB/s write, versus ~1 GiB/s for h5py's default 64 KiB
tiles). Readers do not care about the chunk shape.

Files are written through ``jax_backend.atomic_files`` (a locked temporary file, synced to
disk and published at ``path`` only after the file is complete and closed), so ``path`` is
always absent, the previous whole checkpoint, or the new whole checkpoint -- never half a file.
By default the publish is ``os.replace``, as ``torch.save`` overwrites: concurrent writers to
one path each publish a complete file and the last one wins; a reader that has the old file
open keeps reading it. With ``overwrite=False`` the publish never replaces an existing
``path``, even against a concurrent writer (``atomic_files.rename_no_replace``). A save first
removes the temporary files of earlier saves to the same path whose writer died (killed saves).

HDF5 must never see a failed write: after one, it crashes the process when the file's objects
are closed. So HDF5 writes through :class:`_FailSoftFile`, which records the first ``OSError``
(disk full, file-size limit), drops later writes, and lets the save end with one clear
``OSError`` naming the path and the space the checkpoint needs.
"""

from __future__ import annotations

import io
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import h5py
import numpy as np
import torch

from cstorch.storage import constants as C
from jax_backend.errors import CstorchValueError
from jax_backend.user_frames import warn

try:
    import hdf5plugin  # noqa: F401  (registers the LZ4 filter with HDF5)
except ImportError:  # optional: without it, checkpoints are written uncompressed
    pass
from jax_backend.atomic_files import AtomicFile, remove_stray_temp_files, rename_no_replace
from jax_backend.errors import CstorchError, quoted
from jax_backend.regular_files import check_regular

_CHUNK_BYTES = 1 << 20
# HDF5 refuses object-header attribute messages over 64 KiB unless the file allows v1.8
# "dense" attribute storage; we switch to it only when a pickle needs it, since the earliest
# format is what the reference writes.
COMPACT_ATTRIBUTE_LIMIT = 60_000


class CheckpointFormatError(CstorchError, RuntimeError):
    """A file is HDF5 but not a readable cerebras checkpoint (corrupt, truncated or foreign)."""


class UntrustedCheckpointError(CstorchError, RuntimeError):
    """A checkpoint asks the loader to do something only a trusted file may: read other files
    (external links, external raw storage, virtual datasets, links to other checkpoints) or
    allocate far more memory than it stores."""


TRUST_HINT = (
    "Checkpoints are untrusted by default. If you trust this file and where it "
    "came from, load it with cstorch.load(path, unsafe_allow_pickle=True)."
)


def linked_file_allowed(checkpoint: str, target: str, trusted: bool) -> bool:
    """Whether a checkpoint may read data from ``target`` (a DeferredObject link or a legacy
    ``filepath``): trusted files may link anywhere, untrusted ones only to files in their own
    directory tree (how CSX writes linked checkpoints), never to /etc or a home directory."""
    if trusted:
        return True
    home = os.path.dirname(os.path.realpath(checkpoint))
    real = os.path.realpath(os.path.join(home, target))
    return os.path.commonpath([home, real]) == home


# LZ4 cannot compress better than 255:1; a dataset claiming more than this many bytes per
# stored byte (beyond a small allowance) would make a small file allocate unbounded memory.
_MAX_EXPANSION = 256
_EXPANSION_ALLOWANCE = 1 << 20


def lz4_available() -> bool:
    """Whether HDF5 can run the LZ4 filter (hdf5plugin registers it; an HDF5 plugin directory
    can provide it too)."""
    return bool(h5py.h5z.filter_avail(C.LZ4_FILTER_ID))


_warned_uncompressed = False


def _warn_uncompressed() -> None:
    global _warned_uncompressed
    if not _warned_uncompressed:
        _warned_uncompressed = True
        warn(
            "The hdf5plugin package is not installed, so checkpoints are written without "
            "LZ4 compression (readable everywhere, larger on disk). `pip install hdf5plugin` "
            "restores the reference's LZ4 format."
        )


def chunk_shape(shape: tuple, itemsize: int) -> tuple:
    """Chunks of whole trailing rows, at most ``_CHUNK_BYTES`` (never zero-sized)."""
    chunk = list(shape)
    budget = max(1, _CHUNK_BYTES // max(1, itemsize))
    for axis in range(len(chunk)):
        inner = int(np.prod(chunk[axis + 1 :], dtype=np.int64)) if axis + 1 < len(chunk) else 1
        if inner <= budget:
            chunk[axis] = max(1, min(chunk[axis], budget // inner))
            return tuple(chunk)
        chunk[axis] = 1
    return tuple(max(1, c) for c in chunk)


def attribute_value(value: Any) -> Any:
    """Converts one metadata value the way ``h5py``'s ``attrs.update`` does in the reference."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return np.array(value, dtype=h5py.string_dtype())
    if isinstance(value, (list, tuple)):
        return np.asarray(value)
    return value


def python_value(value: Any) -> Any:
    """The inverse of :func:`attribute_value`: numpy attribute values to JSON-like Python."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "O":
            return [v.decode() if isinstance(v, bytes) else v for v in value.tolist()]
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode()
    return value


class _FailSoftFile(io.RawIOBase):
    """The file HDF5 writes through (see the module docstring): positional reads and writes on
    a file descriptor; after the first failed write, writes are dropped and remembered."""

    def __init__(self, fd: int):
        self.fd = fd
        self.position = 0
        self.end = 0  # how large the file would be had every write succeeded
        self.error: OSError | None = None

    def readable(self):
        return True

    def writable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.end}[whence]
        self.position = base + offset
        return self.position

    def tell(self):
        return self.position

    def readinto(self, buffer):
        view = memoryview(buffer).cast("B")
        count = os.preadv(self.fd, [view], self.position)
        view[count:] = bytes(len(view) - count)  # dropped or unwritten bytes read as zeros
        self.position += len(view)
        return len(view)

    def write(self, data):
        view = memoryview(data).cast("B")
        if self.error is None:
            try:
                done = 0
                while done < len(view):
                    done += os.pwrite(self.fd, view[done:], self.position + done)
            except OSError as e:
                self.error = e
        self.position += len(view)
        self.end = max(self.end, self.position)
        return len(view)

    def truncate(self, size=None):
        size = self.position if size is None else size
        if self.error is None:
            try:
                os.ftruncate(self.fd, size)
            except OSError as e:
                self.error = e
        self.end = size
        return size

    def flush(self):
        pass


class H5Writer:
    """Writes one checkpoint into a temporary file and publishes it atomically on :meth:`commit`."""

    def __init__(
        self, path: str | os.PathLike, *, dense_attributes: bool = False, overwrite: bool = True
    ):
        self.path = os.fspath(path)
        self.overwrite = overwrite
        if not overwrite and os.path.lexists(self.path):
            raise FileExistsError(
                f"Checkpoint at '{self.path}' already exists and the save was called with "
                "exist_ok=False: delete it or choose another path, then save again."
            )
        if os.path.isdir(self.path) and not os.path.islink(self.path):
            raise IsADirectoryError(
                f"Cannot save checkpoint to '{self.path}': it is a directory. Give a file path, "
                f"e.g. '{os.path.join(self.path, 'checkpoint.mdl')}'."
            )
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise FileNotFoundError(
                f"Cannot save checkpoint to '{self.path}': directory '{directory}' does not exist."
            )
        remove_stray_temp_files(self.path)
        # locked: tells later saves this file is not a killed save's leftover
        self._new = AtomicFile(self.path, mode=0o644, lock=True)
        self.temp_path = self._new.temp_path
        self._raw = _FailSoftFile(self._new.fd)
        libver = ("v108", "latest") if dense_attributes else ("earliest", "latest")
        try:
            self._file = h5py.File(self._raw, "w", libver=libver)
        except BaseException:
            self._remove_temp()
            raise

    # -- datasets ------------------------------------------------------------------------------

    def write_array(self, key: str, array: np.ndarray, metadata: dict) -> None:
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
            array = array.copy(order="C")
        options: dict = {}
        if array.ndim > 0 and array.size > 0:
            if lz4_available():
                options = dict(
                    chunks=chunk_shape(array.shape, array.dtype.itemsize),
                    compression=C.LZ4_FILTER_ID,
                    compression_opts=C.LZ4_FILTER_OPTS,
                )
            else:
                _warn_uncompressed()
        dset = self._create(key, dict(shape=array.shape, dtype=array.dtype, **options))
        if array.size:
            dset.write_direct(array)
        self._set_attributes(dset, metadata)
        dset.attrs[C.NUMPY_FLAG] = True

    def write_bytes(self, key: str, payload: bytes, metadata: dict) -> None:
        dset = self._create(key, dict(data=h5py.Empty("f"), track_order=True))
        self._set_attributes(dset, metadata)
        dset.attrs[C.BYTES_FLAG] = np.void(payload)

    def _create(self, key: str, options: dict):
        try:
            return self._file.create_dataset(key, **options)
        except (ValueError, TypeError, OSError) as e:
            raise CstorchValueError(
                f"Cannot write checkpoint key {key!r} to '{self.path}': {e}"
            ) from e

    @staticmethod
    def _set_attributes(dset, metadata: dict) -> None:
        for name, value in metadata.items():
            dset.attrs[name] = attribute_value(value)

    # -- root attributes -----------------------------------------------------------------------

    def write_root_attributes(self, attributes: dict) -> None:
        for name, value in attributes.items():
            self._file.attrs[name] = value

    # -- publishing ----------------------------------------------------------------------------

    def commit(self) -> None:
        """Closes and syncs the file and publishes it at ``path`` in one atomic step."""
        self._file.close()
        self._raise_write_error()
        # Atomic on POSIX: readers see the old file or the new one. A symlink at ``path``
        # is replaced itself; the file it pointed to is left as it was.
        self._new.publish(os.replace if self.overwrite else self._publish_new, durable=True)

    def _publish_new(self, temp_path: str, path: str) -> None:
        """Publishes ``temp_path`` at ``path`` unless a file appeared there meanwhile."""
        try:
            rename_no_replace(temp_path, path)
        except FileExistsError:
            raise FileExistsError(
                f"Checkpoint at '{path}' already exists (it appeared while saving); it was left "
                "as it is and the new checkpoint was not kept. Save again under another name, "
                "or pass exist_ok=True to replace it."
            ) from None

    def _raise_write_error(self) -> None:
        error = self._raw.error
        if error is None:
            return
        needed = self._raw.end
        try:
            usage = os.statvfs(os.path.dirname(os.path.abspath(self.path)))
            free = f", {usage.f_bavail * usage.f_frsize} bytes free"
        except OSError:
            free = ""
        raise OSError(
            error.errno,
            f"Could not save checkpoint '{self.path}': writing failed with "
            f"'{os.strerror(error.errno or 0)}' (disk full or a file-size limit). The checkpoint "
            f"needs about {needed} bytes{free}. Nothing was published and the temporary file "
            "was removed; free some space (or raise the limit) and save again.",
            self.path,
        )

    def _remove_temp(self) -> None:
        self._new.discard()  # closing it releases the lock

    def abort(self) -> None:
        """Closes and deletes the temporary file after a failed save."""
        try:
            if self._file.id.valid:
                self._file.close()
        finally:
            self._remove_temp()


def _uses_lz4(dset) -> bool:
    plist = dset.id.get_create_plist()
    return any(plist.get_filter(i)[0] == C.LZ4_FILTER_ID for i in range(plist.get_nfilters()))


# One LZ4 block as the HDF5 LZ4 filter stores it: total size (u64), block size (u32), then
# the block's stored size (u32) -- equal to the block size when the block is uncompressed.
_LZ4_HEADER = struct.Struct(">QII")
_READ_THREADS = max(2, min(4, os.cpu_count() or 1))


def _pread_into(fd: int, buffers: list, offset: int) -> bool:
    """Fills ``buffers`` from ``fd`` at ``offset``; False on a short read."""
    expected = sum(memoryview(b).nbytes for b in buffers)
    done = 0
    while done < expected:
        views, skip = [], done
        for b in buffers:
            view = memoryview(b).cast("B")
            if skip >= view.nbytes:
                skip -= view.nbytes
                continue
            views.append(view[skip:])
            skip = 0
        count = os.preadv(fd, views, offset + done)
        if count <= 0:
            return False
        done += count
    return True


def _empty(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """An uninitialized array, allocated by torch when it can hold the dtype.

    torch's CPU allocator asks for transparent huge pages on large blocks; first-touching
    numpy's ``np.empty`` memory page by page was 10x slower here (0.4 vs 4 GiB/s), and it was
    the bottleneck of loading.
    """
    try:
        torch_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        return np.empty(shape, dtype=dtype)
    return torch.empty(shape, dtype=torch_dtype).numpy()


def _open_for_reading(path: str) -> h5py.File:
    # Default locking, so that users may open the same file with plain h5py while deferred
    # tensors hold it (HDF5 refuses a second open with different locking flags); filesystems
    # without locks get a best-effort open.
    try:
        return h5py.File(path, "r")
    except OSError as e:
        if "lock" not in str(e).lower():
            raise
        return h5py.File(path, "r", locking="best-effort")


class H5Reader:
    """An open checkpoint file: root attributes, dataset reads, and change detection.

    The file stays open while deferred tensors refer to it, so they keep reading the file that
    was loaded even if ``path`` is later replaced or deleted.
    """

    def __init__(self, path: str | os.PathLike, *, trusted: bool = False):
        self.path = os.fspath(path)
        self.trusted = trusted
        check_regular(self.path, "checkpoint")  # HDF5 would block on a FIFO
        try:
            self._file = _open_for_reading(self.path)
        except OSError as e:
            raise CheckpointFormatError(
                f"Cannot read checkpoint at '{self.path}': the file looks like HDF5 but HDF5 "
                f"cannot open it (truncated or corrupt?): {e}"
            ) from e
        self._stat = self._fstat()

    @staticmethod
    def is_hdf5(path: str | os.PathLike) -> bool:
        """False for a missing file; NotARegularFileError for a FIFO, device or directory."""
        try:
            check_regular(path, "checkpoint")
        except FileNotFoundError:
            return False
        return h5py.is_hdf5(os.fspath(path))

    def root_attributes(self) -> dict:
        try:
            return {name: self._file.attrs[name] for name in self._file.attrs}
        except (OSError, KeyError) as e:
            raise CheckpointFormatError(
                f"Cannot read the metadata of checkpoint '{self.path}' (corrupt file?): {e}"
            ) from e

    def __contains__(self, key: str) -> bool:
        return key in self._file

    def dataset(self, key: str):
        try:
            link = self._file.get(key, getlink=True)
            if link is None:
                raise KeyError(key)
            if not self.trusted and not isinstance(link, h5py.HardLink):
                raise UntrustedCheckpointError(
                    f"Key {quoted(key)} of checkpoint '{self.path}' is an HDF5 {type(link).__name__} "
                    f"(to {quoted(getattr(link, 'filename', '') + getattr(link, 'path', ''))}), "
                    f"which could make the loader read another file. {TRUST_HINT}"
                )
            dset = self._file[key]
        except KeyError:
            raise CheckpointFormatError(
                f"Checkpoint '{self.path}' has no dataset for key {quoted(key)}: the file is "
                "incomplete or was not written by cstorch.save."
            ) from None
        if not self.trusted and isinstance(dset, h5py.Dataset):
            if dset.is_virtual or dset.external:
                what = "a virtual dataset" if dset.is_virtual else "external raw storage"
                raise UntrustedCheckpointError(
                    f"Key {quoted(key)} of checkpoint '{self.path}' uses {what}, which reads other "
                    f"files by path. {TRUST_HINT}"
                )
        return dset

    def _check_allocation(self, key: str, dset) -> None:
        """A small file must not make us allocate unbounded memory (see _MAX_EXPANSION)."""
        if self.trusted or dset.shape is None:
            return
        declared = int(np.prod(dset.shape, dtype=np.int64)) * dset.dtype.itemsize
        stored = dset.id.get_storage_size()
        if declared > _MAX_EXPANSION * stored + _EXPANSION_ALLOWANCE:
            raise UntrustedCheckpointError(
                f"Key {quoted(key)} of checkpoint '{self.path}' declares {declared} bytes of data but "
                f"stores only {stored}; reading it would allocate memory the file does not "
                f"hold (a corrupt or crafted file). {TRUST_HINT}"
            )

    def dataset_metadata(self, key: str) -> dict:
        dset = self.dataset(key)
        return {
            name: python_value(value) for name, value in dset.attrs.items() if name != C.BYTES_FLAG
        }

    def read_array(self, key: str) -> np.ndarray:
        """Reads a whole dataset into a fresh array (one copy, straight from the chunks)."""
        dset = self.dataset(key)
        self._check_allocation(key, dset)
        out = _empty(dset.shape, dset.dtype)
        try:
            if out.size and not self._read_stored_bytes(dset, out):
                dset.read_direct(out)
        except OSError as e:
            if _uses_lz4(dset) and not lz4_available():
                raise CheckpointFormatError(
                    f"Key {quoted(key)} of checkpoint '{self.path}' is LZ4-compressed, and this "
                    "Python cannot decompress it: install the hdf5plugin package (`pip install "
                    "hdf5plugin`), which provides HDF5's LZ4 filter."
                ) from None
            raise CheckpointFormatError(
                f"Cannot read key {quoted(key)} from checkpoint '{self.path}' (corrupt data): "
                f"{str(e)[:300]}"
            ) from e
        return out

    def _read_stored_bytes(self, dset, out: np.ndarray) -> bool:
        """Fast path: ``preadv`` the stored bytes straight into ``out``; False if not possible.

        Applies to datasets stored contiguously without filters, and to row-chunked datasets
        (chunks spanning all trailing dimensions, as we write them) with only the LZ4 filter
        whose chunks hold one uncompressed LZ4 block -- what LZ4 stores for incompressible
        data such as trained weights. That skips HDF5's two intermediate copies and reads
        chunks on several threads. Any chunk that does not fit (a compressed block, an odd
        header, a short read) is re-read through HDF5.
        """
        fd = self._fd()
        if fd is None or not out.flags.c_contiguous:
            return False
        flat = out.reshape(-1).view(np.uint8)
        plist = dset.id.get_create_plist()
        if dset.chunks is None:
            offset = dset.id.get_offset()
            if plist.get_nfilters() or offset is None:
                return False
            return _pread_into(fd, [flat], offset)
        filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
        if filters != [C.LZ4_FILTER_ID] or tuple(dset.chunks[1:]) != tuple(dset.shape[1:]):
            return False
        row_bytes = flat.nbytes // dset.shape[0]
        chunk_bytes = dset.chunks[0] * row_bytes
        jobs = []
        for index in range(dset.id.get_num_chunks()):
            info = dset.id.get_chunk_info(index)
            start = info.chunk_offset[0] * row_bytes
            valid = min(chunk_bytes, flat.nbytes - start)
            if info.filter_mask or info.size != chunk_bytes + _LZ4_HEADER.size or valid <= 0:
                return False
            jobs.append(
                (flat[start : start + valid], info.byte_offset, chunk_bytes, info.chunk_offset[0])
            )
        if len(jobs) * chunk_bytes < flat.nbytes:
            return False  # unallocated chunks (fill values): let HDF5 handle them

        def read_chunk(job):
            target, offset, nbytes, row = job
            header = bytearray(_LZ4_HEADER.size)
            ok = _pread_into(fd, [header, target], offset)
            if not ok or _LZ4_HEADER.unpack(header) != (nbytes, nbytes, nbytes):
                rows = slice(row, row + target.nbytes // row_bytes)
                dset.read_direct(out, source_sel=np.s_[rows], dest_sel=np.s_[rows])

        if len(jobs) < 8:
            for job in jobs:
                read_chunk(job)
        else:
            with ThreadPoolExecutor(max_workers=_READ_THREADS) as pool:
                list(pool.map(read_chunk, jobs))
        return True

    def _fd(self) -> int | None:
        try:
            return self._file.id.get_vfd_handle()
        except (OSError, TypeError, ValueError):
            return None

    def read_bytes(self, key: str) -> bytes | None:
        value = self.dataset(key).attrs.get(C.BYTES_FLAG)
        return None if value is None else value.tobytes()

    def _fstat(self) -> os.stat_result | None:
        try:
            return os.fstat(self._file.id.get_vfd_handle())
        except (OSError, TypeError, ValueError):
            return None

    def changed_since_open(self) -> bool:
        """True when the open file's size or modification time differs from when it was opened."""
        now = self._fstat()
        if self._stat is None or now is None:
            return False
        return (now.st_mtime_ns, now.st_size) != (self._stat.st_mtime_ns, self._stat.st_size)

    def close(self) -> None:
        if self._file.id.valid:
            self._file.close()
