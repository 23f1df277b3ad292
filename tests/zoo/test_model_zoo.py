"""The unchanged Cerebras Model Zoo trains on this project (opt-in: see tests/zoo/README.md).

Runs only when ``MODELZOO_SRC`` names a zoo checkout's ``src`` folder; each run is a
subprocess of ``ZOO_PYTHON`` (default: this interpreter) with the zoo, this project, its
``compat/`` and the zoo check's stand-ins on ``PYTHONPATH``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import paths

ROOT = Path(paths.REPO)
ZOO_SRC = os.environ.get("MODELZOO_SRC")
PYTHON = os.environ.get("ZOO_PYTHON", sys.executable)
REFERENCE = json.loads((ROOT / "tests" / "data" / "zoo_fc_mnist_reference.json").read_text())

pytestmark = pytest.mark.skipif(
    not ZOO_SRC,
    reason="set MODELZOO_SRC to a Model Zoo Release_2.10.0 src/ folder (tests/zoo/README.md)",
)


def _env():
    paths = [ZOO_SRC, str(ROOT), str(ROOT / "compat"), str(ROOT / "tests" / "zoo" / "stubs")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _run(tmp_path, *args, timeout=900):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            PYTHON,
            str(ROOT / "tests" / "zoo" / "run_zoo.py"),
            *args,
            "--model-dir",
            str(tmp_path / "model_dir"),
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def test_scan_resolves_every_cerebras_pytorch_use():
    proc = subprocess.run(
        [PYTHON, str(ROOT / "tools" / "zoo_scan.py"), ZOO_SRC],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    resolved, total = summary.split()[1].split("/")
    assert resolved == total, summary


def test_zoo_config_classes_from_optimizer_signatures(tmp_path):
    """The YAML path's validation builds pydantic configs from constructor annotations."""
    script = tmp_path / "configs.py"
    script.write_text(
        "from typing import List\n"
        "from pydantic import Field\n"
        "from typing_extensions import Annotated\n"
        "import cerebras.pytorch as cstorch\n"
        "from cerebras.pytorch.optim.optimizer import ParamsT\n"
        "from cerebras.modelzoo.config import create_config_class\n"
        "cstorch.backend('CPU')\n"
        "mapping = {ParamsT: Annotated[List[dict], Field(default=[])],\n"
        "           (float, 'lr'): Annotated[float, Field(default=0.1, alias='learning_rate')]}\n"
        "sgd = create_config_class(cstorch.optim.SGD, custom_type_mapping=mapping)\n"
        "print(sgd(learning_rate=0.001, momentum=0.9).model_dump()['momentum'])\n"
        "adamw = create_config_class(cstorch.optim.AdamW, custom_type_mapping=mapping)\n"
        "print(adamw(learning_rate=0.001, betas=[0.9, 0.95]).model_dump()['betas'])\n"
    )
    proc = subprocess.run(
        [PYTHON, str(script)], env=_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["0.9", "(0.9,", "0.95)"]


def test_fc_mnist_cpu_matches_cerebras_pytorch(tmp_path):
    reference = REFERENCE["fc_mnist_cpu"]["mixed_precision_off"]
    result = _run(
        tmp_path,
        "--model",
        "fc_mnist",
        "--device",
        "CPU",
        "--steps",
        "20",
        "--checkpoint-steps",
        "10",
        "--mixed-precision",
        "off",
    )
    assert result["checkpoints"] == ["checkpoint_10.mdl", "checkpoint_20.mdl"]
    assert len(result["train_losses"]) == 20
    for ours, theirs in zip(
        result["train_losses"] + result["val_losses"],
        reference["train_losses"] + reference["val_losses"],
    ):
        assert abs(ours - theirs) <= 1e-5, (result, reference)


@pytest.mark.parametrize("device", ["CPU", "CSX"])
def test_fc_mnist_mixed_precision_with_checkpoints_and_validate(tmp_path, device):
    result = _run(
        tmp_path,
        "--model",
        "fc_mnist",
        "--device",
        device,
        "--steps",
        "20",
        "--checkpoint-steps",
        "10",
    )
    assert result["checkpoints"] == ["checkpoint_10.mdl", "checkpoint_20.mdl"]
    assert len(result["train_losses"]) == 20 and len(result["val_losses"]) == 3
    reference = REFERENCE["fc_mnist_cpu"]["mixed_precision_on"]["train_losses"]
    # bfloat16: the first step is the reference's to the bit only without XLA's excess
    # precision; after it, kernels round differently. Same scale, same trend.
    assert abs(result["train_losses"][0] - reference[0]) < 0.02
    assert abs(result["train_losses"][-1] - reference[-1]) < 0.02


@pytest.mark.parametrize("device", ["CPU", "CSX"])
def test_tiny_gpt2_from_the_registry_trains(tmp_path, device):
    result = _run(
        tmp_path, "--model", "gpt2", "--device", device, "--steps", "10", "--checkpoint-steps", "5"
    )
    assert result["checkpoints"] == ["checkpoint_5.mdl", "checkpoint_10.mdl"]
    losses = result["train_losses"]
    assert len(losses) == 10 and all(9.0 < loss < 11.0 for loss in losses)  # ~ln(32000)


def _sweep_tools():
    import importlib.util

    spec = importlib.util.spec_from_file_location("zoo_sweep", ROOT / "tools" / "zoo_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny(sweep, tmp_path, name):
    src = Path(ZOO_SRC)
    registry = sweep.yaml.safe_load(
        (src / "cerebras" / "modelzoo" / "registry" / "registry.yaml").read_text()
    )["models"]
    entry = next(m for m in registry if m["name"] == name)
    processors = {p.rsplit(".", 1)[-1] for p in entry["data_processor_paths"]}
    config, note = sweep.tiny_config(name, sweep.shipped_configs(src), processors, tmp_path)
    assert config is not None, note
    path = tmp_path / "tiny.yaml"
    path.write_text(sweep.yaml.safe_dump(config))
    return src, path


def test_cszoo_fit_on_the_unchanged_zoo_trains_like_the_python_trainer(tmp_path):
    """The zoo's own command line (its trainer/validate.py rebuilds a torch TreeSpec with
    dataclasses.replace: cerebras.appliance.torch_compat) trains fc_mnist from its shipped
    config exactly as the Trainer built in Python does."""
    sweep = _sweep_tools()
    src, path = _tiny(sweep, tmp_path, "fc_mnist")
    python = sweep.run_worker(PYTHON, src, True, path, "python", "CPU", "fp32", 3, tmp_path)
    cli = sweep.run_worker(PYTHON, src, True, path, "yaml", "CPU", "fp32", 3, tmp_path)
    assert python["error"] is None and cli["error"] is None, (python, cli)
    assert len(cli["losses"]) == 3
    assert sweep._rel(cli["losses"], python["losses"]) <= 1e-6, (cli, python)


def test_shipped_cbfloat16_config_trains_on_csx(tmp_path):
    """gpt3's shipped precision (cbfloat16, dynamic loss scaling) on the modeled wafer: the
    scale stays at the reference's 2**31, every step updates the weights, and the losses
    track the float32 CPU run within 1e-2."""
    sweep = _sweep_tools()
    src, path = _tiny(sweep, tmp_path, "gpt3")
    config = sweep.yaml.safe_load(path.read_text())
    assert config["trainer"]["init"]["precision"]["fp16_type"] == "cbfloat16"
    fp32 = sweep.run_worker(PYTHON, src, True, path, "python", "CPU", "fp32", 4, tmp_path)
    csx = sweep.run_worker(PYTHON, src, True, path, "python", "CSX", "shipped", 4, tmp_path)
    assert fp32["error"] is None and csx["error"] is None, (fp32, csx)
    assert csx["loss_scales"] == [2.0**31] * 4
    assert len(set(csx["losses"])) == 4
    assert sweep._rel(csx["losses"], fp32["losses"]) <= 1e-2, (csx, fp32)
