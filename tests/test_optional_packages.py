"""The project on a machine like the lent GPU machine: run from the source tree
(``PYTHONPATH``), with neither ``hdf5plugin`` nor ``pydantic`` importable (issue 25).

Each case runs in a subprocess whose ``sitecustomize`` blocks those imports, as if the
packages were not installed; the oracle is the same values saved and read back, and plain
h5py's view of the file."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import h5py
import hdf5plugin  # noqa: F401  (this process writes LZ4 files for the blocked one)
import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from tests.paths import REPO as ROOT

BLOCKED = ("hdf5plugin", "pydantic")

SITECUSTOMIZE = textwrap.dedent(f"""
    # Written by tests/test_optional_packages.py: these packages are "not installed".
    import importlib.abc, sys

    class _NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {BLOCKED!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, _NotInstalled())
""")


@pytest.fixture
def gpu_like_env(tmp_path):
    """The environment of a subprocess without hdf5plugin and pydantic, running the project
    from this source tree."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "compat"), str(blocker)]),
        PYTHONUNBUFFERED="1",
        CSTORCH_GRAPH_CACHE="off",
        CSTORCH_COMPILATION_CACHE="off",
    )
    return env


def _python(code, env, cwd, timeout=300):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_the_blocker_hides_the_packages_and_the_source_tree_is_used(gpu_like_env, tmp_path):
    out = _python(
        """
        import importlib, json
        import cstorch
        missing = []
        for name in ("hdf5plugin", "pydantic"):
            try:
                importlib.import_module(name)
            except ModuleNotFoundError:
                missing.append(name)
        print(json.dumps({"missing": missing, "cstorch": cstorch.__file__}))
    """,
        gpu_like_env,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["missing"] == list(BLOCKED)
    assert result["cstorch"].startswith(os.path.join(ROOT, "cstorch"))


@pytest.mark.slow
def test_checkpoints_without_hdf5plugin_are_uncompressed_with_one_warning(gpu_like_env, tmp_path):
    out = _python(
        """
        import json, warnings
        import torch
        import cerebras.pytorch as cstorch

        torch.manual_seed(0)
        model = torch.nn.Linear(64, 32)
        state = {"model": model.state_dict(), "step": 3, "mask": torch.ones(8, dtype=torch.bool)}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cstorch.save(state, "first.mdl")
            cstorch.save(state, "second.mdl")
        ours = [str(w.message) for w in caught if "hdf5plugin" in str(w.message)]
        loaded = cstorch.load("second.mdl")
        same = all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())
        print(json.dumps({"warnings": ours, "same": same and loaded["step"] == 3
                          and torch.equal(loaded["mask"], state["mask"])}))
    """,
        gpu_like_env,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["warnings"]) == 1, result["warnings"]
    assert "pip install hdf5plugin" in result["warnings"][0]
    assert result["same"]
    with h5py.File(tmp_path / "first.mdl", "r") as f:  # any HDF5 reader: no filter at all
        weight = f["model.weight"]
        assert weight.id.get_create_plist().get_nfilters() == 0
        torch.manual_seed(0)
        np.testing.assert_array_equal(weight[()], torch.nn.Linear(64, 32).weight.detach())


@pytest.mark.slow
def test_reading_lz4_without_hdf5plugin_names_the_package(gpu_like_env, tmp_path):
    # Written here, where hdf5plugin is installed: zeros compress, so HDF5 must decompress.
    compressible = {"w": torch.zeros(256, 64)}
    cstorch.save(compressible, str(tmp_path / "lz4.mdl"))
    with h5py.File(tmp_path / "lz4.mdl", "r") as f:
        plist = f["w"].id.get_create_plist()
        assert [plist.get_filter(i)[0] for i in range(plist.get_nfilters())] == [32004]
        assert f["w"].id.get_storage_size() < 256 * 64 * 4 // 10
    out = _python(
        """
        import cerebras.pytorch as cstorch
        try:
            cstorch.load("lz4.mdl")["w"].sum()
        except Exception as error:
            print(type(error).__name__, error)
    """,
        gpu_like_env,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "CheckpointFormatError" in out.stdout
    assert "LZ4-compressed" in out.stdout and "pip install hdf5plugin" in out.stdout


@pytest.mark.slow
def test_yaml_validation_without_pydantic_is_a_clear_error(gpu_like_env, tmp_path):
    out = _python(
        """
        from cerebras.modelzoo.trainer import Trainer  # the Python API needs no pydantic
        print("trainer", Trainer.__name__)
    """,
        gpu_like_env,
        tmp_path,
    )
    assert out.returncode == 0 and "trainer Trainer" in out.stdout, out.stderr[-3000:]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cerebras.modelzoo.trainer",
            "fit",
            os.path.join(ROOT, "examples", "trainer_mnist.yaml"),
        ],
        env=gpu_like_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert "needs the pydantic package" in out.stderr and "pip install" in out.stderr


BENCH_STUB = textwrap.dedent("""
    import argparse, json
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    with open(args.json, "w") as f:
        json.dump({"stub": True}, f)
""")


@pytest.mark.slow
def test_gpu_check_in_its_smallest_setting(gpu_like_env, tmp_path):
    """``tools/gpu_check.py --quick`` on this CPU, without the optional packages, on MNIST and
    the bfloat16 GPT (the float32 GPT goes through the parity tool in the README's test):
    each case passes (JAX on the CPU, said so), the benchmark's JSON is kept, all in one
    file."""
    stub = tmp_path / "bench_stub.py"
    stub.write_text(BENCH_STUB)
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tools", "gpu_check.py"),
            "--out",
            str(tmp_path / "out"),
            "--quick",
            "--cases",
            "mnist_mlp,gpt_adamw_bf16",
            "--bench",
            str(stub),
        ],
        env=gpu_like_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with open(tmp_path / "out" / "gpu_check.json") as f:
        result = json.load(f)
    assert result["ok"] and result["platform"]["hdf5plugin"] is None
    assert result["engines"] == ["eager", "jax-cpu"] and "no GPU" in result["note"]
    assert [p["case"] for p in result["parity"]] == ["mnist_mlp", "gpt_adamw_bf16"]
    for case in result["parity"]:
        report = case["report"]
        assert case["verdict"] == "ok" and report["ok"]
        losses = [r for r in report["rows"] if r["value"].endswith("loss")]
        assert losses and all(r["ok"] == [True] for r in losses)
    # fp32: the JAX program's losses equal eager torch's to float32 rounding.
    assert result["parity"][0]["report"]["engines_vs_reference"][0]["largest_rel_diff"] < 1e-5
    assert result["bench"]["results"] == {"stub": True}
    assert "step" in out.stdout and "rel diff" in out.stdout  # the per-step tables


def test_gpu_check_runs_every_example_by_default_and_refuses_an_unknown_case(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "gpu_check", os.path.join(ROOT, "tools", "gpu_check.py")
    )
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    cases = gpu_check.cases(True, str(tmp_path))
    assert [name for name, _, _ in cases] == ["mnist_mlp", "gpt_adamw_fp32", "gpt_adamw_bf16"]
    assert all(os.path.exists(script) for _, script, _ in cases)
    assert [args[args.index("--precision") + 1] for _, _, args in cases[1:]] == [
        "float32",
        "bfloat16",
    ]
    with pytest.raises(SystemExit) as info:
        gpu_check.main(["--out", str(tmp_path / "out"), "--cases", "gpt_adamw_fp64"])
    assert info.value.code == 2 and not (tmp_path / "out").exists()  # refused before any run
