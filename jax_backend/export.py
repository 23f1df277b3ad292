"""Writing a compiled step as a self-contained artifact (read by ``jax_backend.exported``).

The step is exported with ``jax.export`` as the function ``(used_state, inputs, seed) ->
(written_state, outputs)`` for the shapes it was compiled for; the state arrays go next to it
with a manifest naming them, so a process with JAX but without torch can keep training.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shutil
import tomllib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export  # a submodule `import jax` loads only from JAX 0.8

from jax_backend import exported
from jax_backend.atomic_files import staged_directory
from jax_backend.errors import CstorchNotImplementedError
from jax_backend.jax_settings import in_engine_scope
from jax_backend.program import Program


def made_by(exp) -> dict:
    """What wrote an artifact: the versions a later JAX needs to say whether it can still read
    it (``jax.export`` reads a serialization only within its compatibility window), and the
    loader's error names when it cannot."""
    return {
        "jax": jax.__version__,
        "jaxlib": _distribution_version("jaxlib"),
        # the flatbuffer schema of jax.export (JAX stores a placeholder in the file itself
        # before 0.11: only the manifest has the real number)
        "jax_export_serialization_version": _jax_export_serialization_version(),
        "calling_convention_version": int(exp.calling_convention_version),
        "stablehlo_version": _stablehlo_target_version(),
        "cstorch_jax": project_version(),
    }


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _jax_export_serialization_version() -> int | None:
    try:  # JAX keeps it private; None where a release moves it
        module = importlib.import_module("jax._src.export.serialization")
    except ImportError:
        return None
    version = getattr(module, "_SERIALIZATION_VERSION", None)
    return version if isinstance(version, int) else None


def _stablehlo_target_version() -> str | None:
    """The StableHLO version ``jax.export`` writes the module in (four weeks old, JAX's
    choice), or None where this JAX does not say."""
    try:
        from jax.extend.mlir.dialects import stablehlo

        return str(
            stablehlo.get_version_from_compatibility_requirement(
                stablehlo.StablehloCompatibilityRequirement.WEEK_4
            )
        )
    except (ImportError, AttributeError):
        return None


def project_version() -> str:
    """This project's version: the installed distribution's, else pyproject.toml's (a source
    tree on ``PYTHONPATH``)."""
    version = _distribution_version("cstorch-jax")
    if version is not None:
        return version
    pyproject = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml"
    )
    try:
        with open(pyproject, "rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


@in_engine_scope
def export_program(
    program: Program,
    path: str,
    state: dict,
    state_info: list,
    used: list,
    written: list,
    returned: list,
    single: bool,
    closure_values: list,
    hyperparameters: Sequence = (),
    function: str = "step",
    vjp_order: int = 0,
    platforms=None,
) -> str:
    """Writes the artifact directory ``path`` (replacing an earlier export there).

    ``state``: name -> array, for every name in ``used`` and ``written`` (the program's state
    inputs and outputs, in order) and ``hyperparameters`` (the names of its runtime scalars,
    ``jax_backend.scalars``, in input order: the exported step feeds them from its state);
    ``state_info``: ``[{"name", "kind"}]`` in the order to store them; ``returned``: indices of
    the outputs the step returns (``single``: it returned one tensor); ``closure_values``:
    ``[{"name", "index"}]`` of outputs passed to closures.
    """
    if program.layout is not None:
        raise CstorchNotImplementedError(
            "Exporting a step that runs over several devices (a CSX cluster layout) is not "
            "supported; export it from a CPU or GPU backend."
        )

    # One platform: lowered for it; several: nothing vendor-specific (e.g. no cuDNN call).
    platform = None
    if platforms is not None:
        platform = platforms[0] if len(platforms) == 1 else "any"

    def step(used_arrays, inputs, seed):
        donated, kept = program.split_state(used_arrays)
        return program.pure_step(donated, kept, inputs, seed, platform=platform)

    used_specs = [
        jax.ShapeDtypeStruct(np.shape(state[n]), jnp.asarray(state[n]).dtype) for n in used
    ]
    input_specs = program.input_specs()  # the batch's, then the runtime scalars'
    batch_specs = input_specs[: len(input_specs) - len(hyperparameters)]
    seed_spec = jax.ShapeDtypeStruct((), jnp.int64)
    try:
        exp = jax_export.export(jax.jit(step), platforms=platforms)(
            used_specs, input_specs, seed_spec
        )
    except (NotImplementedError, ValueError) as error:
        if "callback" not in str(error):
            raise
        raise CstorchNotImplementedError(
            "This step cannot be exported: it calls back into Python on the host, which "
            "jax.export cannot serialize. On the CPU backend, top-k weight-sparsity masks "
            "(e.g. GMP's updates) run torch.topk on the host to keep the same weights as "
            "cerebras-pytorch among equal scores. Export the step from a GPU "
            "backend (there top-k keeps the lower index among equal scores, on device), or "
            "export a step without sparsity."
        ) from error
    blob = exp.serialize(vjp_order=vjp_order)

    manifest_state, arrays = [], {}
    for i, info in enumerate(state_info):
        stored, dtype = exported.encode_array(np.asarray(state[info["name"]]))
        arrays[f"s{i}"] = stored
        manifest_state.append(dict(info, shape=list(stored.shape), dtype=dtype))
    manifest = {
        "format": exported.FORMAT,
        "version": exported.VERSION,
        "function": function,
        "state": manifest_state,
        "used": list(used),
        "written": list(written),
        "inputs": [{"shape": list(s.shape), "dtype": str(s.dtype)} for s in batch_specs],
        "hyperparameters": list(hyperparameters),
        "outputs": [
            {"shape": list(a.shape), "dtype": str(a.dtype)} for a in exp.out_avals[len(written) :]
        ],
        "returned": list(returned),
        "single": bool(single),
        "closure_values": closure_values,
        "uses_rng": bool(program.uses_rng),
        "platforms": list(exp.platforms),
        "vjp_order": vjp_order,
        "jax_version": jax.__version__,
        "made_by": made_by(exp),
    }
    # Written to a sibling directory first, so a failed export leaves an older one intact.
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with staged_directory(path, prefix=".export-") as staging:
        with open(os.path.join(staging, exported.PROGRAM), "wb") as f:
            f.write(blob)
        with open(os.path.join(staging, exported.STATE), "wb") as f:
            np.savez(f, **arrays)
        with open(os.path.join(staging, exported.MANIFEST), "w") as text:
            json.dump(manifest, text, indent=1)
        shutil.copyfile(exported.__file__, os.path.join(staging, exported.MODULE))
        if os.path.isdir(path):
            if not os.path.exists(os.path.join(path, exported.MANIFEST)):
                raise FileExistsError(
                    f"{path!r} exists and is not an exported step; choose a new directory."
                )
            shutil.rmtree(path)
    return path
