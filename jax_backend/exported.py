"""Running an exported cstorch step with JAX alone: no torch, no cstorch.

An artifact written by ``cstorch.export`` is a directory::

    manifest.json      what the step takes and returns, and the name/kind of each state array
    step.jaxexport     the step as serialized StableHLO (``jax.export``)
    state.npz          the state (parameters, buffers, optimizer and scheduler state) at export
    exported_step.py   a copy of this module

This module imports only the standard library, numpy and JAX, so the artifact runs where torch
is not installed: ``sys.path.insert(0, artifact); import exported_step;
step = exported_step.load(artifact)``; then ``loss = step(inputs, targets)`` runs one step and
keeps the new state, and ``step.pure(state, inputs)`` is the same step as a pure function of
a state dict (jit-able; differentiable when exported with ``vjp_order >= 1``). A forward-only
step (exported with ``vjp_order=1``) trains in a JAX loop through ``step.apply(params,
buffers, inputs)``, which returns the loss with the new buffers (BatchNorm's running
statistics), ready for ``jax.value_and_grad(step.apply, has_aux=True)``.

Loading changes nothing in JAX's process-wide config: the loader uses 64-bit types (torch's
int64/float64) only inside its own calls. A step whose inputs or state are 64-bit needs them
in the caller's ``jax.jit`` too: turn them on there (``jax.config.update("jax_enable_x64",
True)``, or ``with jax.enable_x64(True):`` around the jit call); ``pure`` says so otherwise.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import stat
import zipfile

import numpy as np

try:  # in the project, every error derives from the one root
    from jax_backend.errors import CstorchError, CstorchTypeError, CstorchValueError, quoted
except ImportError:  # this file is also the standalone loader, exported_step.py: JAX and numpy only

    class CstorchError(Exception):  # type: ignore[no-redef]
        """The standalone loader's stand-in for the project's root error."""

    class CstorchTypeError(CstorchError, TypeError):  # type: ignore[no-redef]
        """The standalone loader's stand-in for the project's ``CstorchTypeError``."""

    class CstorchValueError(CstorchError, ValueError):  # type: ignore[no-redef]
        """The standalone loader's stand-in for the project's ``CstorchValueError``."""

    def quoted(value, limit: int = 60) -> str:
        """A short quote of a manifest's value (a copy of ``jax_backend.errors.quoted``, for
        strings; anything else is cut after its repr)."""
        if isinstance(value, str):
            if len(value) <= limit:
                return repr(value)
            return f"{value[:limit]!r}... ({len(value)} characters)"
        text = repr(value)
        return text if len(text) <= 2 * limit else text[: 2 * limit] + "..."


try:
    import fcntl
except ImportError:  # Windows: no FIFOs to block on, no O_NONBLOCK to clear
    fcntl = None  # type: ignore[assignment]

FORMAT = "cstorch-export"
VERSION = 1
MANIFEST, PROGRAM, STATE, MODULE = (
    "manifest.json",
    "step.jaxexport",
    "state.npz",
    "exported_step.py",
)
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_NPY_HEADER_BYTES = 1 << 16  # numpy writes headers of a few hundred bytes


class ExportError(CstorchError, ValueError):
    """An artifact that is missing, damaged or from an unknown format version."""


class ExportVersionError(ExportError):
    """An artifact whose program the installed JAX cannot read: ``jax.export`` reads a
    serialization only within its compatibility window (about six months), and only one
    written by a JAX it knows of."""


def _open_regular(path: str, what: str):
    """``path`` opened for binary reading if it is a regular file; ExportError if it is a
    FIFO, device, socket or directory (a FIFO would block the loader, a device never end).
    Opened with ``O_NONBLOCK`` and checked with ``fstat``, so nothing is read first. (A copy
    of ``jax_backend.regular_files``: this module must run where that package is absent.)"""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
    except OSError as error:  # a socket cannot be opened at all (ENXIO): say what it is
        try:
            mode = os.stat(path).st_mode
        except OSError:
            raise error from None
        if stat.S_ISREG(mode):
            raise
        raise ExportError(
            f"{what} of the exported step, {path!r}, is {_kind(mode)}; only "
            "regular files are read. Export the step again."
        ) from error
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ExportError(
                f"{what} of the exported step, {path!r}, is {_kind(mode)}; only "
                "regular files are read. Export the step again."
            )
        if fcntl is not None:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _kind(mode: int) -> str:
    return (
        "a directory"
        if stat.S_ISDIR(mode)
        else "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "not a regular file"
    )


def _jax():
    import jax
    import jax.export  # a submodule `import jax` loads only from JAX 0.8

    return jax


def _x64():
    """64-bit types for the block, on this thread only (torch's int64/float64 keep their
    dtypes); JAX's process-wide setting is left alone."""
    jax = _jax()
    if hasattr(jax, "enable_x64"):  # JAX >= 0.8
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # JAX 0.6 and 0.7

    return enable_x64(True)


def _x64_enabled() -> bool:
    return bool(_jax().config.jax_enable_x64)


def encode_array(array: np.ndarray) -> tuple:
    """``(storable array, dtype name)``: dtypes numpy cannot name in a file (bfloat16, ...)
    are stored as unsigned integers of the same width."""
    array = np.asarray(array)
    name = str(array.dtype)
    if array.dtype.kind in "biufc" and array.dtype.names is None and name != "bfloat16":
        return array, name
    return array.view(f"uint{array.dtype.itemsize * 8}"), name


def stored_dtype(name: str):
    """The dtype ``encode_array`` stores an array of dtype ``name`` as."""
    dtype = _jax().numpy.dtype(name)
    if dtype.hasobject or dtype.kind not in "biufcV":
        raise ExportError(f"state of dtype {quoted(name)} is not numeric")
    if dtype.kind in "biufc" and dtype.names is None and name != "bfloat16":
        return dtype
    return np.dtype(f"uint{dtype.itemsize * 8}")


def _read_state_array(archive: zipfile.ZipFile, key: str, entry: dict, path: str):
    """The member ``key`` of ``state.npz``, read only after its zip directory entry and its
    ``.npy`` header agree with the manifest's shape and dtype: a member must be stored
    uncompressed (as ``cstorch.export`` writes it) and hold exactly that many bytes, so a
    small file cannot make the loader allocate more than the file holds."""
    name, shape = quoted(entry["name"]), tuple(entry["shape"])  # (name: for messages)
    try:
        member = archive.getinfo(f"{key}.npy")
    except KeyError:
        raise ExportError(f"{STATE} of {path!r} lacks {name}.") from None
    dtype = stored_dtype(entry["dtype"])
    nbytes = dtype.itemsize
    for d in shape:
        nbytes *= d
    if member.compress_type != zipfile.ZIP_STORED:
        raise ExportError(
            f"{name} is compressed in {STATE} of {path!r}; cstorch.export "
            "stores state uncompressed, so this file was not written by it."
        )
    if (
        not nbytes <= member.file_size <= nbytes + MAX_NPY_HEADER_BYTES
        or member.compress_size != member.file_size
    ):
        raise ExportError(
            f"{name} takes {member.file_size} bytes in {STATE} of {path!r}, but "
            f"its manifest shape {shape} and dtype {quoted(entry['dtype'])} need "
            f"{nbytes}."
        )
    with archive.open(member) as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ExportError(f"{name} in {STATE} of {path!r} has .npy version {version}.")
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        stored_shape, fortran_order, stored = read_header(f)
        if tuple(stored_shape) != shape or stored != dtype:
            raise ExportError(
                f"{name} has shape {tuple(stored_shape)} and dtype {stored} in "
                f"{STATE} but {shape} and {dtype} in the manifest of {path!r}."
            )
        if member.file_size - f.tell() != nbytes:
            raise ExportError(f"{name} in {STATE} of {path!r} does not hold {nbytes} bytes.")
        data = f.read(nbytes)
    if len(data) != nbytes:
        raise ExportError(f"{name} in {STATE} of {path!r} is truncated.")
    return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran_order else "C")


def decode_array(array: np.ndarray, name: str):
    jnp = _jax().numpy
    dtype = jnp.dtype(name)
    if array.dtype == dtype:
        return array
    if array.dtype.itemsize != dtype.itemsize or array.dtype.kind != "u":
        raise ExportError(f"state array stored as {array.dtype} cannot hold {quoted(name)}")
    return array.view(dtype)


def _read_manifest(path: str) -> dict:
    try:
        with _open_regular(os.path.join(path, MANIFEST), "the manifest") as f:
            text = f.read(MAX_MANIFEST_BYTES + 1)
        if len(text) > MAX_MANIFEST_BYTES:
            raise ExportError(
                f"the manifest of {path!r} is larger than "
                f"{MAX_MANIFEST_BYTES >> 20} MiB; it is not one cstorch wrote."
            )
        manifest = json.loads(text.decode("utf-8"))
    except FileNotFoundError:
        raise ExportError(
            f"{path!r} is not an exported step: it has no {MANIFEST}. Write one "
            "with cstorch.export(step, example_batch, path)."
        ) from None
    except NotADirectoryError:
        raise ExportError(
            f"{path!r} is not an exported step (a directory written by cstorch.export)."
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportError(f"{os.path.join(path, MANIFEST)} is not valid JSON: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ExportError(f"{path!r} holds no {FORMAT} manifest.")
    if manifest.get("version") != VERSION:
        raise ExportError(
            f"{path!r} is format version {quoted(manifest.get('version'))}; this "
            f"loader reads version {VERSION}. Export it again."
        )
    for key in ("state", "used", "written", "inputs", "returned", "closure_values"):
        if not isinstance(manifest.get(key), list):
            raise ExportError(f"the manifest of {path!r} lacks the list {key!r}.")
    return manifest


def written_by(manifest: dict) -> str:
    """The versions that wrote an artifact, in words (its manifest's ``made_by``; artifacts
    written before the manifest had one name only their JAX)."""
    made_by = manifest.get("made_by")
    if not isinstance(made_by, dict):
        return f"JAX {_version(manifest.get('jax_version', 'of unknown version'))}"
    parts = [
        f"jaxlib {_version(made_by.get('jaxlib'))}",
        "jax.export serialization version "
        f"{_version(made_by.get('jax_export_serialization_version'))}",
        f"calling convention {_version(made_by.get('calling_convention_version'))}",
        f"StableHLO {_version(made_by.get('stablehlo_version'))}",
    ]
    return (
        f"JAX {_version(made_by.get('jax'))} ({', '.join(parts)}) for cstorch-jax "
        f"{_version(made_by.get('cstorch_jax'))}"
    )


def _version(value) -> str:
    """A version from a manifest, as written there, or a short quote of anything longer or
    odder than a version (the manifest is a foreign file)."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is not None and len(text) <= 40 and text.isprintable() and " " not in text:
        return text
    return quoted(value, 40)


def _unreadable_program(path: str, manifest: dict, error: Exception) -> ExportError:
    """The error for a ``step.jaxexport`` this JAX does not deserialize: a version error when
    another JAX wrote it (or JAX says the version is the reason), else damage."""
    jax = _jax()
    try:
        here = f"JAX {jax.__version__} (jaxlib {importlib.metadata.version('jaxlib')})"
    except importlib.metadata.PackageNotFoundError:
        here = f"JAX {jax.__version__}"
    writer = written_by(manifest)
    made_by: dict = manifest["made_by"] if isinstance(manifest.get("made_by"), dict) else {}
    writer_jax = made_by.get("jax", manifest.get("jax_version"))
    reason = f"{type(error).__name__}: {str(error)[:500]}"
    about_versions = "version" in str(error) or "window" in str(error)
    if not isinstance(writer_jax, str) or (writer_jax == jax.__version__ and not about_versions):
        return ExportError(f"{PROGRAM} of {path!r} is damaged ({reason}); export the step again.")
    pin = (
        f"pip install 'jax=={_version(writer_jax)}' "
        f"'jaxlib=={_version(made_by.get('jaxlib') or writer_jax)}'"
    )
    expired = "jax_export_deserialize_expired_versions" in getattr(
        jax.config, "values", {}
    ) and "window" in str(error)
    return ExportVersionError(
        f"{PROGRAM} of {path!r} was written by {writer}; the installed {here} cannot read it "
        f"({reason}). jax.export reads a program only within its compatibility window (about "
        f"six months). Export the step again under this JAX: run the script that made it "
        f"(its checkpoint restores the state) up to cstorch.export(step, example_batch, path); "
        f"or run this artifact under the JAX that wrote it ({pin})."
        + (
            " JAX_EXPORT_DESERIALIZE_EXPIRED_VERSIONS=1 makes this JAX read it anyway, without "
            "its guarantees."
            if expired
            else ""
        )
    )


class ExportedStep:
    """An exported training (or evaluation) step with its state."""

    def __init__(self, path: str):
        with _x64():
            self._load(path)

    def _load(self, path: str):
        jax = _jax()
        self.path = path
        self.manifest = manifest = _read_manifest(path)
        try:
            with _open_regular(os.path.join(path, PROGRAM), PROGRAM) as f:
                self.exported = jax.export.deserialize(bytearray(f.read()))
        except ExportError:
            raise
        except OSError as error:
            raise ExportError(f"cannot read {PROGRAM} of {path!r}: {error}") from None
        except Exception as error:  # noqa: BLE001 - an unreadable program: age or damage
            raise _unreadable_program(path, manifest, error) from None
        for entry in manifest["state"]:
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("shape"), list)
                and all(type(d) is int and 0 <= d < 1 << 62 for d in entry["shape"])
                and isinstance(entry.get("dtype"), str)
            ):
                raise ExportError(
                    f"the manifest of {path!r} has a malformed state entry {str(entry)[:200]}."
                )
        self.kinds = {entry["name"]: entry.get("kind") for entry in manifest["state"]}
        state = {}
        try:
            with (
                _open_regular(os.path.join(path, STATE), STATE) as f,
                zipfile.ZipFile(f) as archive,
            ):
                for i, entry in enumerate(manifest["state"]):
                    array = _read_state_array(archive, f"s{i}", entry, path)
                    state[entry["name"]] = jax.numpy.asarray(decode_array(array, entry["dtype"]))
        except ExportError:
            raise
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as error:
            raise ExportError(
                f"{STATE} of {path!r} cannot be read ({str(error)[:300]}); export the step again."
            ) from None
        hyperparameters = manifest.get("hyperparameters", [])
        if not isinstance(hyperparameters, list):
            raise ExportError(f"the manifest of {path!r} has malformed hyperparameters.")
        missing = [
            n
            for n in manifest["used"] + manifest["written"] + hyperparameters
            if not isinstance(n, str) or n not in state
        ]
        if missing:
            raise ExportError(
                f"the manifest of {path!r} names unknown state "
                f"{', '.join(map(quoted, missing[:3]))}."
            )
        self.state = state
        self.steps_run = 0
        self._call = jax.jit(self.pure)

    # ------------------------------------------------------------------------ the function
    def pure(self, state: dict, inputs, seed=0):
        """``(new_state, returned)``: one step as a pure function. ``state`` maps names to
        arrays (``self.state`` has them all); ``returned`` is what the step returned (an array,
        or a tuple when it returned several tensors or none)."""
        jax = _jax()
        if (
            not _x64_enabled()
            and self._takes_64_bits()
            and any(
                isinstance(leaf, jax.core.Tracer)
                for leaf in jax.tree_util.tree_leaves((state, inputs, seed))
            )
        ):
            raise ExportError(
                "This exported step takes 64-bit arrays (torch's int64/float64), which JAX "
                "narrows in a jit traced without 64-bit types. Turn them on for your program: "
                'jax.config.update("jax_enable_x64", True), or call your jitted function '
                "inside `with jax.enable_x64(True):`."
            )
        with _x64():
            return self._pure(state, inputs, seed)

    def _takes_64_bits(self) -> bool:
        """Whether a state array or input is 64-bit (the seed is made inside ``_pure``)."""
        wide = {np.dtype(n) for n in ("int64", "uint64", "float64", "complex128")}
        return any(np.dtype(aval.dtype) in wide for aval in self.exported.in_avals[:-1])

    def _pure(self, state: dict, inputs, seed):
        jnp = _jax().numpy
        used = [state[name] for name in self.manifest["used"]]
        # A torch optimizer's floats (lr, betas, ...) follow the batch: read from the state
        hyperparameters = [
            jnp.asarray(state[name], jnp.float64)
            for name in self.manifest.get("hyperparameters", [])
        ]
        written, outputs = self.exported.call(
            used, list(inputs) + hyperparameters, jnp.asarray(seed, jnp.int64)
        )
        new_state = dict(state)
        new_state.update(zip(self.manifest["written"], written))
        return new_state, self._returned(outputs)

    def _returned(self, outputs):
        values = tuple(outputs[i] for i in self.manifest["returned"])
        return values[0] if self.manifest.get("single") else values

    def closure_values(self, outputs) -> dict:
        """The values the step passed to its closures, by closure argument name."""
        return {entry["name"]: outputs[entry["index"]] for entry in self.manifest["closure_values"]}

    # ----------------------------------------------------------------------- stateful use
    def __call__(self, *inputs, seed=None):
        """Runs one step on ``inputs`` (arrays of the exported shapes and dtypes), keeps the
        new state and returns what the step returned. ``seed`` feeds the step's random ops
        (default: the number of steps run so far)."""
        arrays = self._check_inputs(inputs)
        if seed is None:
            seed = self.steps_run
        with _x64():
            self.state, returned = self._call(self.state, arrays, seed)
        self.steps_run += 1
        return returned

    def _check_inputs(self, inputs) -> list:
        specs = self.manifest["inputs"]
        if len(inputs) != len(specs):
            raise CstorchTypeError(
                f"the exported step takes {len(specs)} input arrays, got {len(inputs)}."
            )
        arrays = []
        for i, (value, spec) in enumerate(zip(inputs, specs)):
            array = np.asarray(value)
            try:
                dtype, shape = _jax().numpy.dtype(spec["dtype"]), list(spec["shape"])
            except (TypeError, ValueError, KeyError):
                raise ExportError(
                    f"the manifest of {self.path!r} has a malformed input entry {quoted(spec)}."
                ) from None
            if list(array.shape) != shape:
                raise CstorchValueError(
                    f"input {i} has shape {array.shape}; the step was exported "
                    f"for {quoted(tuple(shape))}. Export it again for this shape."
                )
            if array.dtype != dtype:
                if not np.can_cast(array.dtype, dtype, "same_kind"):
                    raise CstorchTypeError(
                        f"input {i} has dtype {array.dtype}; the step takes {dtype}."
                    )
                array = array.astype(dtype)
            arrays.append(array)
        return arrays

    def params(self) -> dict:
        """The model parameters among the state (by state name, e.g. ``model0.fc.weight``)."""
        return {name: value for name, value in self.state.items() if self.kinds[name] == "param"}

    def buffers(self) -> dict:
        """The rest of the state: buffers (BatchNorm's running statistics), and optimizer and
        scheduler state if the step has them, by state name."""
        return {name: value for name, value in self.state.items() if self.kinds[name] != "param"}

    def apply(self, params: dict, buffers: dict, inputs, seed=0):
        """``(returned, new_buffers)``: a forward-only step as a pure function of its
        parameters, for JAX training loops. ``returned`` is what the step returned (its loss);
        ``new_buffers`` are ``buffers`` with the step's updates (BatchNorm's running
        statistics in train mode), to pass to the next call. With ``has_aux=True``,
        ``jax.value_and_grad(step.apply, has_aux=True)(params, buffers, inputs)`` gives
        ``((loss, new_buffers), grads)``. (``pure(...)[1]`` alone would drop those updates.)

        Steps that update their parameters themselves (a training step with an optimizer)
        are refused: their new parameters would be lost; use ``pure`` or ``__call__``."""
        updated = [n for n in self.manifest["written"] if self.kinds.get(n) == "param"]
        if updated:
            raise ExportError(
                f"apply is for a forward-only step, but this step updates its parameters "
                f"itself ({', '.join(map(quoted, updated[:3]))}"
                f"{' ...' if len(updated) > 3 else ''}): a "
                "training step with its optimizer. Export a step that only computes the loss "
                "(with vjp_order=1) to train it in JAX, or run this one with pure / step(...)."
            )
        unknown = sorted(set(params) - {n for n, k in self.kinds.items() if k == "param"})
        if unknown:
            raise ExportError(
                f"apply got parameters the step does not have: {unknown[:3]} "
                f"(its parameters are named like "
                f"{quoted(next(iter(self.params()), '-'))};"
                " start from step.params())."
            )
        new_state, returned = self.pure({**self.state, **buffers, **params}, inputs, seed)
        return returned, {name: new_state[name] for name in buffers}


def load(path: str) -> ExportedStep:
    """Loads an artifact written by ``cstorch.export``."""
    return ExportedStep(os.fspath(path))
