"""``Trainer(sparsity=...)`` and ``LogSparsity``: a static top-k algorithm prunes inside the
compiled step exactly as a hand-written eager torch loop with fixed masks does."""

import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer import Trainer
from cerebras.modelzoo.trainer.callbacks import Checkpoint, LogSparsity, TrainingLoop
from cerebras.modelzoo.trainer.loggers import Logger
from tests.trainer.common import batches, seeded_model, torch_loader

SEED, STEPS, LR = 3, 4, 0.1


class Collect(Logger):
    def __init__(self):
        self.steps = []

    def log_metrics(self, metrics, step):
        self.steps.append({k: float(v) for k, v in metrics.items()})


def _topk_mask(weight, keep_fraction):
    """Keeps the largest-magnitude ``keep_fraction`` of the entries (ties: lower index)."""
    flat = weight.abs().flatten()
    keep = int(round(keep_fraction * flat.numel()))
    order = sorted(range(flat.numel()), key=lambda i: (-flat[i].item(), i))[:keep]
    mask = torch.zeros(flat.numel(), dtype=torch.bool)
    mask[order] = True
    return mask.view_as(weight)


def _eager(train):
    model = seeded_model(SEED)
    # An algorithm applied directly (not through ``configure``) sparsifies every parameter.
    masks = {n: _topk_mask(p.detach(), 0.5) for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for batch in train:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in masks:
                    p.mul_(masks[n])
        loss = model(batch)
        optimizer.zero_grad()
        loss.backward()
        for n, p in model.named_parameters():
            if n in masks:
                p.grad.mul_(masks[n])
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in masks:
                p.mul_(masks[n])
    return losses, masks, model.state_dict()


@pytest.mark.slow
def test_static_sparsity_matches_eager_masking_and_is_logged_and_checkpointed(tmp_path):
    collect = Collect()
    trainer = Trainer(
        device="CPU",
        model_dir=tmp_path,
        model=lambda: seeded_model(SEED),
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=LR),
        sparsity=lambda: cstorch.sparse.Static(sparsity=0.5, init_method="topk"),
        loop=TrainingLoop(num_steps=STEPS, eval_frequency=None),
        checkpoint=Checkpoint(steps=STEPS),
        callbacks=[LogSparsity()],
        loggers=[collect],
        seed=SEED,
    )
    trainer.fit(cstorch.utils.data.DataLoader(torch_loader, STEPS))

    eager_losses, masks, eager_state = _eager(batches(STEPS))
    losses = [s["loss"] for s in collect.steps if "loss" in s]
    assert len(losses) == STEPS
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=1e-5, atol=0)

    state = trainer.model.state_dict()
    for name, mask in masks.items():
        assert torch.equal(state[f"{name}_mask"], mask)
        torch.testing.assert_close(state[name], eager_state[name], rtol=1e-5, atol=1e-7)
        assert torch.count_nonzero(state[name][~mask]) == 0
        logged = [s[f"sparsity/{name}"] for s in collect.steps if f"sparsity/{name}" in s]
        assert logged and all(abs(v - 0.5) < 1e-6 for v in logged)

    saved = cstorch.load(str(tmp_path / f"checkpoint_{STEPS}.mdl"))
    assert "sparsity" in saved
    for name, mask in masks.items():
        assert torch.equal(saved["model"][f"{name}_mask"], mask)


def test_sparsity_config_from_yaml_style_values_and_bad_input(tmp_path):
    trainer = Trainer(
        device="CPU",
        model_dir=tmp_path,
        model=lambda: seeded_model(SEED),
        optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=LR),
        sparsity={"algorithm": "static", "sparsity": 0.25},
        loop=TrainingLoop(num_steps=1, eval_frequency=None),
        seed=SEED,
    )
    assert isinstance(trainer.sparsity, cstorch.sparse.SparsityAlgorithm)
    assert any(n.endswith("_mask") for n, _ in trainer.model.named_buffers())

    import pytest

    with pytest.raises(TypeError, match="sparsity"):
        Trainer(
            device="CPU",
            model_dir=tmp_path / "b",
            model=lambda: seeded_model(SEED),
            sparsity="not an algorithm",
            seed=SEED,
        )
