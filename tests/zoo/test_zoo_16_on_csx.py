"""Model Zoo 1.6 (R_1.6.0 and R_1.6.1) fc_mnist trains on CSX and evaluates from its
checkpoint through its own ``run.py``, in a user's environment: the zoo process gets no
``PYTHONPATH`` at all (nothing of ``tests/`` or ``tools/``), only what ``ZOO_PYTHON`` has
installed (this project, editable or not, and a torchvision, which 1.6's fc_mnist imports at
module level). The two PyTorch/XLA pieces 1.6 imports on a CS system come from the 1.x lazy
API (``cerebras_pytorch.lazy.xla_pieces``), and only during the run.

Opt-in, as the other zoo tests: ``MODELZOO_SRC`` must be a Model Zoo git clone (or bare git
dir) holding the tags, as for ``make zoo-generations``; ``ZOO_PYTHON`` (default this
interpreter) must import torchvision.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import paths

ROOT = Path(paths.REPO)
ZOO_SRC = os.environ.get("MODELZOO_SRC")
PYTHON = os.environ.get("ZOO_PYTHON", sys.executable)
TAGS = ("R_1.6.0", "R_1.6.1")

pytestmark = pytest.mark.skipif(
    not ZOO_SRC,
    reason="set MODELZOO_SRC to a Model Zoo git clone holding the 1.6 tags "
    "(tests/zoo/GENERATIONS_1x.md)",
)


@pytest.fixture(scope="module")
def tool():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import zoo_generations
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return zoo_generations


def _user_environment() -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "ZOO_GENERATIONS", "CSTORCH_ENGINE"))
    }
    return env


def _run(argv, cwd, log):
    proc = subprocess.run(
        [PYTHON, *argv],
        cwd=cwd,
        env=_user_environment(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    text = proc.stdout + proc.stderr
    log.write_text(text)
    assert proc.returncode == 0, text[-6000:]
    return text


@pytest.mark.slow
@pytest.mark.parametrize("tag", TAGS)
def test_16_fc_mnist_trains_on_csx_and_evaluates_its_checkpoint(tool, tag, tmp_path):
    gitdir = tool.git_dir(Path(ZOO_SRC), required=False)
    if gitdir is None:
        pytest.skip(f"MODELZOO_SRC={ZOO_SRC} is not a git repository holding the release tags")
    if subprocess.run(
        ["git", "--git-dir", str(gitdir), "rev-parse", "-q", "--verify", f"refs/tags/{tag}"],
        capture_output=True,
    ).returncode:
        pytest.skip(f"{tag} is not a tag of {gitdir}")
    if subprocess.run(
        [PYTHON, "-c", "import torchvision"], capture_output=True, env=_user_environment()
    ).returncode:
        pytest.skip(f"{PYTHON} has no torchvision (1.6's fc_mnist imports it at module level)")
    zoo = tmp_path / "zoo"
    tool.checkout(gitdir, tag, zoo)
    run_py = str(zoo / "modelzoo" / "fc_mnist" / "pytorch" / "run.py")
    settings = tool.Settings()
    shipped = zoo / "modelzoo" / "fc_mnist" / "pytorch" / "configs" / "params.yaml"
    params = tool.fc_mnist_params_1x(yaml.safe_load(shipped.read_text()), settings)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # no zoo module may be importable from the test's own folders either
    assert not (ROOT / "tests" / "zoo" / "stubs" / "torch_xla").exists()

    train_log = _run(
        tool.cli_17(run_py, "CSX", "train", "params.yaml", "model_dir", None),
        tmp_path,
        tmp_path / "train.log",
    )
    losses, _ = tool.losses_1x(tmp_path / "model_dir", train_log)
    assert sorted(losses) == list(range(1, settings.steps + 1))
    assert losses[settings.steps] < 0.6 * losses[1]  # it learns (2.53 -> 1.15 here)
    checkpoints = tool.checkpoints_2x(tmp_path / "model_dir")
    assert settings.steps in checkpoints

    last = checkpoints[settings.steps]
    eval_log = _run(
        tool.cli_17(run_py, "CSX", "eval", "params.yaml", "model_dir_eval", last),
        tmp_path,
        tmp_path / "eval.log",
    )
    _, eval_loss = tool.losses_1x(tmp_path / "model_dir_eval", eval_log)
    reference = tool.fc_mnist_reference_eval(last, params)  # eager torch, float64
    assert eval_loss == pytest.approx(reference, rel=tool.CSX_TOLERANCE)
    # the user's own interpreter finds no torch_xla outside the run
    check = subprocess.run(
        [
            PYTHON,
            "-c",
            "import importlib.util, cerebras_pytorch; "
            "assert importlib.util.find_spec('torch_xla') is None",
        ],
        cwd=tmp_path,
        env=_user_environment(),
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr[-2000:]
