"""A hostile exported step cannot make the loader allocate without bound.

``state.npz`` is checked against the manifest from the zip directory (stored, not
compressed; exactly the bytes the manifest's shape and dtype need) and from each member's
``.npy`` header, before any array data is read. The attack: a member holding 1 GiB of
deflated zeros (a 4 MiB file) whose header promises a 2**28-element array. Each load runs in
its own process, without torch, on the standalone ``exported_step.py`` the artifact carries,
and measures how much its peak resident memory grew.
"""

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch

HUGE = 1 << 28  # float32 elements: 1 GiB
GROWTH_LIMIT_MIB = 64


def _npy_header(shape, dtype="<f4") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": dtype, "fortran_order": False, "shape": tuple(shape)}
    )
    return buffer.getvalue()


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """A small exported step (a linear layer's loss, SGD)."""
    directory = tmp_path_factory.mktemp("export")
    cstorch.backend("CPU")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    x = torch.ones(3, 4)
    step(x)
    return cstorch.export(step, x, str(directory / "good"))


@pytest.fixture(scope="module")
def bomb(artifact, tmp_path_factory):
    """The artifact's state.npz with its s0 member replaced by 1 GiB of deflated zeros under
    a (2**28,) float32 header (the other members as exported)."""
    path = tmp_path_factory.mktemp("bomb") / "state.npz"
    with (
        zipfile.ZipFile(os.path.join(artifact, "state.npz")) as good,
        zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z,
    ):
        with z.open("s0.npy", "w", force_zip64=True) as member:
            member.write(_npy_header((HUGE,)))
            zeros = bytes(1 << 22)
            for _ in range((HUGE * 4) // len(zeros)):
                member.write(zeros)
        for info in good.infolist():
            if info.filename != "s0.npy":
                z.writestr(info.filename, good.read(info))
    assert path.stat().st_size < 16 << 20
    return path


def _hostile(artifact, tmp_path, state_npz=None, manifest_edit=None, name="hostile"):
    target = tmp_path / name
    shutil.copytree(artifact, target)
    if state_npz is not None:
        shutil.copyfile(state_npz, target / "state.npz")
    if manifest_edit is not None:
        manifest = json.loads((target / "manifest.json").read_text())
        manifest_edit(manifest)
        (target / "manifest.json").write_text(json.dumps(manifest))
    return target


# Runs the artifact's own exported_step.py where torch cannot load. The good artifact is
# loaded first, so that JAX and the program's deserialization are in the baseline.
PROBE = textwrap.dedent("""
    import json, resource, sys
    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "cstorch", "cerebras", "jax_backend"):
                raise ImportError(f"this process must not import {name}")
    sys.meta_path.insert(0, _NoTorch())
    good, hostile = sys.argv[1], sys.argv[2]
    sys.path.insert(0, hostile)
    import exported_step
    exported_step.load(good)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        exported_step.load(hostile)
        error = None
    except exported_step.ExportError as e:
        error = str(e)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"error": error, "growth_mib": (after - before) / 1024}))
""")


def _load_in_fresh_process(good, hostile, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, str(script), str(good), str(hostile)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _first_state_shape(manifest):
    return manifest["state"][0]["shape"]


@pytest.mark.slow
def test_a_deflated_bomb_is_refused_unread(artifact, bomb, tmp_path):
    hostile = _hostile(artifact, tmp_path, state_npz=bomb)
    result = _load_in_fresh_process(artifact, hostile, tmp_path)
    assert result["growth_mib"] < GROWTH_LIMIT_MIB, result
    assert result["error"] and "compressed" in result["error"], result


def test_a_deflated_member_is_refused_even_where_the_manifest_agrees(artifact, bomb, tmp_path):
    def claim_huge(manifest):
        manifest["state"][0]["shape"] = [HUGE]

    hostile = _hostile(artifact, tmp_path, state_npz=bomb, manifest_edit=claim_huge)
    result = _load_in_fresh_process(artifact, hostile, tmp_path)
    assert result["growth_mib"] < GROWTH_LIMIT_MIB, result
    assert result["error"] and "compressed" in result["error"], result


@pytest.mark.slow
def test_a_header_promising_more_than_its_member_holds_is_refused(artifact, tmp_path):
    """Uncompressed, but the header says 2**28 elements in a member of a few bytes; and a
    member whose header disagrees with the manifest's shape."""
    good = np.load(os.path.join(artifact, "state.npz"))
    members = {name: good[name] for name in good.files}

    def write(path, header_shape):
        with zipfile.ZipFile(path, "w") as z:
            for name, array in members.items():
                if name == "s0":
                    z.writestr("s0.npy", _npy_header(header_shape) + array.tobytes())
                else:
                    buffer = io.BytesIO()
                    np.save(buffer, array)
                    z.writestr(f"{name}.npy", buffer.getvalue())

    short = tmp_path / "short.npz"
    write(short, (HUGE,))

    def claim_huge(manifest):
        manifest["state"][0]["shape"] = [HUGE]

    hostile = _hostile(artifact, tmp_path, state_npz=short, manifest_edit=claim_huge, name="short")
    result = _load_in_fresh_process(artifact, hostile, tmp_path)
    assert result["growth_mib"] < GROWTH_LIMIT_MIB, result
    assert result["error"] and "need" in result["error"], result

    reshaped = tmp_path / "reshaped.npz"
    size = int(np.prod(members["s0"].shape))
    write(reshaped, (size, 1))  # the right bytes under another shape
    hostile = _hostile(artifact, tmp_path, state_npz=reshaped, name="reshaped")
    result = _load_in_fresh_process(artifact, hostile, tmp_path)
    assert result["error"] and "in the manifest" in result["error"], result


def test_the_intact_artifact_still_loads_and_runs(artifact):
    from jax_backend import exported

    step = exported.load(artifact)
    state = np.load(os.path.join(artifact, "state.npz"))
    manifest = json.loads(Path(artifact, "manifest.json").read_text())
    for i, entry in enumerate(manifest["state"]):
        np.testing.assert_array_equal(np.asarray(step.state[entry["name"]]), state[f"s{i}"])
    assert np.isfinite(float(step(np.ones((3, 4), np.float32))))
