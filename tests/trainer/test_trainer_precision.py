"""MixedPrecision in the Trainer: clipping against eager torch, half dtypes, loss scaling."""

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer import Trainer
from cerebras.modelzoo.trainer.callbacks import Callback, Checkpoint, MixedPrecision, TrainingLoop
from tests.trainer.common import ClassifierMLP, batches, seeded_model, torch_loader


class Losses(Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
        self.record(outputs["loss"])

    @cstorch.step_closure
    def record(self, loss):
        self.values.append(loss.item())


def fit(tmp_path, precision, device="CPU", steps=6, checkpoint=None):
    losses = Losses()
    trainer = Trainer(
        device=device,
        model_dir=tmp_path,
        model=ClassifierMLP,
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.5),
        precision=precision,
        loop=TrainingLoop(num_steps=steps, eval_frequency=None),
        checkpoint=checkpoint,
        callbacks=[losses],
        seed=11,
    )
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, steps))
    return trainer, losses.values


def eager(clip_norm=None, clip_value=None, steps=6):
    model = seeded_model(11)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for batch in batches(steps):
        loss = model(batch)
        loss.backward()
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        if clip_value is not None:
            torch.nn.utils.clip_grad_value_(model.parameters(), clip_value)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("clip", [{"max_gradient_norm": 0.1}, {"max_gradient_value": 0.01}])
@pytest.mark.slow
def test_gradient_clipping_matches_eager_torch(tmp_path, clip):
    _, losses = fit(tmp_path, MixedPrecision(enabled=False, **clip))
    want = eager(clip_norm=clip.get("max_gradient_norm"), clip_value=clip.get("max_gradient_value"))
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    assert not np.allclose(losses, eager(), rtol=1e-3)  # clipping changed the trajectory


@pytest.mark.slow
def test_bfloat16_on_cpu_stays_close_to_fp32(tmp_path):
    with pytest.warns(UserWarning, match="only bfloat16"):
        trainer, losses = fit(tmp_path, MixedPrecision(fp16_type="float16"))
    assert trainer.precision.fp16_type == "bfloat16" and trainer.precision.grad_scaler is None
    assert cstorch.amp.get_half_dtype() == torch.bfloat16
    np.testing.assert_allclose(losses, eager(), rtol=3e-2)


@pytest.mark.slow
def test_float16_on_csx_uses_a_dynamic_loss_scaler_saved_in_checkpoints(tmp_path):
    trainer, losses = fit(
        tmp_path,
        MixedPrecision(fp16_type="float16", loss_scaling_factor="dynamic"),
        device="CSX",
        checkpoint=Checkpoint(steps=6),
    )
    assert trainer.precision.grad_scaler is not None
    np.testing.assert_allclose(losses, eager(), rtol=5e-2)
    saved = cstorch.load(str(tmp_path / "checkpoint_6.mdl"))
    assert "grad_scaler" in saved and float(saved["grad_scaler"]["loss_scale"]) > 0
