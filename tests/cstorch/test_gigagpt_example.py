"""examples/gigagpt_style.py, a training script in gigaGPT's style, on CPU and CSX with a
checkpoint resume: its first loss is eager torch's, a resumed run repeats the original run's
losses, and its checkpoints and TensorBoard scalars are written."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.paths import EXAMPLES

pytestmark = pytest.mark.slow  # trains the example end to end

EXAMPLE = os.path.join(EXAMPLES, "gigagpt_style.py")


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("gigagpt_style", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gigagpt_style"] = module  # dataclasses resolve annotations through it
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gigagpt_style", None)


def _configs(example, backend, out_dir, **run):
    model = example.ModelConfig(vocab_size=64, width=32, depth=1, heads=2, max_positions=16)
    config = example.RunConfig(
        backend=backend,
        out_dir=str(out_dir),
        batch_size=4,
        num_steps=4,
        checkpoint_steps=2,
        warmup_steps=2,
        learning_rate=3e-3,
        **run,
    )
    return model, config


def _eager_first_loss(example, model_config, config, dataset):
    """Eager torch on the same first batch, from the same initial weights: built as the
    script builds them (seeded, under the backend's device, whose random ops draw from
    freshly seeded generators as in cerebras-pytorch), but never compiled."""
    cstorch.backend._reset_for_tests()
    backend = cstorch.backend(config.backend, artifact_dir=str(config.out_dir))
    torch.manual_seed(config.seed)
    with backend.device:
        model = example.LanguageModel(model_config)
    cstorch.backend._reset_for_tests()
    loader = example.token_batches(
        dataset, model_config.max_positions, config.batch_size, config.seed, 0
    )
    input_ids, labels = next(iter(loader))
    with torch.no_grad():
        return model(input_ids, labels).item()


@pytest.mark.parametrize("backend", ["CPU", "CSX"])
def test_gigagpt_style_example_trains_and_resumes(example, tmp_path, backend):
    model_config, config = _configs(example, backend, tmp_path / "run")
    losses = example.train(model_config, config)
    assert [step for step, _ in losses] == [1, 2, 3, 4]
    assert all(torch.isfinite(torch.tensor(loss)) for _, loss in losses)
    for step in (2, 4):
        assert os.path.exists(tmp_path / "run" / f"checkpoint_{step}.mdl")
    dataset = str(tmp_path / "run" / "train.bin")

    eager = _eager_first_loss(example, model_config, config, dataset)
    if backend == "CPU":
        assert losses[0][1] == pytest.approx(eager, rel=1e-6, abs=1e-6)
    else:  # bfloat16 mixed precision on the wafer
        assert losses[0][1] == pytest.approx(eager, rel=2e-2)

    from cerebras.pytorch.utils.tensorboard import SummaryReader

    reader = SummaryReader(str(tmp_path / "run" / "train"))
    assert reader.read_scalar("loss", 1).value == pytest.approx(losses[0][1], rel=1e-6)
    assert reader.read_scalar("samples_per_second", 1).value == 0.0  # the compiling step
    assert reader.read_scalar("samples_per_second", 4).value > 0.0

    cstorch.backend._reset_for_tests()
    _, resumed_config = _configs(
        example,
        backend,
        tmp_path / "resumed",
        dataset=dataset,
        checkpoint_path=str(tmp_path / "run" / "checkpoint_2.mdl"),
    )
    resumed = example.train(model_config, resumed_config)
    assert resumed == losses[2:]  # the same batches and state: the same numbers
    assert os.path.exists(tmp_path / "resumed" / "checkpoint_4.mdl")
