"""A GPT trained the way gigaGPT trains one: plain torch model, cstorch everywhere else.

The layout follows Cerebras' gigaGPT (its own code, written for this project): the model
computes its loss, the data is a ``uint16`` token file read through ``np.memmap``, and the
training script uses ``cstorch.backend(..., cluster_config=...)``, AdamW with a decay and a
no-decay group, linear warmup then cosine decay, gradient clipping inside the traced step, a
``@checkpoint_closure`` that saves model, optimizer, scheduler and step, a ``@step_closure``
that logs loss and samples/sec (``executor.profiler.rate_tracker``) to the console and to
TensorBoard, and a resume from any saved checkpoint that continues exactly where the run left
off (the data position is part of the step count).

    python examples/gigagpt_style.py --backend CPU --num-steps 20 --checkpoint-steps 10
    python examples/gigagpt_style.py --backend CPU --num-steps 20 \
        --checkpoint-path out/checkpoint_10.mdl

``--backend CSX`` trains in bfloat16 mixed precision on the modelled wafer. Without
``--dataset`` a synthetic token file is written to ``<out-dir>/train.bin``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os

import numpy as np
import torch
import torch.nn as nn

import cerebras.pytorch as cstorch

logger = logging.getLogger("gigagpt_style")


# ------------------------------------------------------------------------------------- model
@dataclasses.dataclass
class ModelConfig:
    vocab_size: int = 256
    width: int = 128
    depth: int = 2
    heads: int = 4
    max_positions: int = 64
    init_std: float = 0.02


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        self.output = nn.Linear(width, width)

    def forward(self, x, mask):
        batch, length, width = x.shape
        split = lambda t: t.view(batch, length, self.heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads) + mask
        weights = torch.softmax(scores.float(), dim=-1).type_as(scores)
        return self.output((weights @ v).transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm_attention, self.norm_mlp = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x, mask):
        x = x + self.attention(self.norm_attention(x), mask)
        return x + self.mlp(self.norm_mlp(x))


class LanguageModel(nn.Module):
    """Returns the mean next-token cross-entropy of ``labels`` given ``input_ids``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.token_embedding = nn.Embedding(config.vocab_size, config.width)
        self.position_embedding = nn.Embedding(config.max_positions, config.width)
        self.blocks = nn.ModuleList(Block(config.width, config.heads) for _ in range(config.depth))
        self.final_norm = nn.LayerNorm(config.width)
        self.lm_head = nn.Linear(config.width, config.vocab_size, bias=False)
        causal = torch.triu(torch.full((config.max_positions,) * 2, float("-inf")), diagonal=1)
        self.register_buffer("causal_mask", causal, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=config.init_std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, input_ids, labels):
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(positions)
        mask = self.causal_mask[:length, :length]
        for block in self.blocks:
            x = block(x, mask)
        logits = self.lm_head(self.final_norm(x))
        return nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1).long()
        )


# -------------------------------------------------------------------------------------- data
class TokenFile(torch.utils.data.Dataset):
    """Consecutive windows of a ``uint16`` token file: (input_ids, labels shifted by one)."""

    def __init__(self, path: str, length: int):
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        self.length = length

    def __len__(self):
        return (len(self.tokens) - 1) // self.length

    def __getitem__(self, index):
        window = self.tokens[index * self.length : (index + 1) * self.length + 1].astype(np.int32)
        return torch.from_numpy(window[:-1]), torch.from_numpy(window[1:])


class ShuffledBatches(torch.utils.data.Sampler):
    """Batches of a seeded permutation, epoch after epoch, starting at batch ``start``: a
    resumed run sees exactly the batches the interrupted run had not seen yet."""

    def __init__(self, size: int, batch_size: int, seed: int, start: int = 0):
        self.size, self.batch_size, self.seed, self.start = size, batch_size, seed, start
        self.per_epoch = size // batch_size
        if self.per_epoch == 0:
            raise ValueError(
                f"The dataset has {size} sequences, fewer than one batch ({batch_size})."
            )

    def __len__(self):
        return self.per_epoch

    def __iter__(self):
        batch = self.start
        while True:
            epoch, index = divmod(batch, self.per_epoch)
            order = torch.randperm(
                self.size, generator=torch.Generator().manual_seed(self.seed + epoch)
            )
            yield order[index * self.batch_size : (index + 1) * self.batch_size].tolist()
            batch += 1


def token_batches(path: str, length: int, batch_size: int, seed: int, start: int):
    dataset = TokenFile(path, length)
    sampler = ShuffledBatches(len(dataset), batch_size, seed, start)
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler)


def write_synthetic_tokens(path: str, vocab: int, count: int, seed: int = 0) -> None:
    """Tokens that repeat short random phrases, so the loss has something to learn."""
    rng = np.random.default_rng(seed)
    phrases = rng.integers(0, vocab, size=(32, 8))
    picks = rng.integers(0, len(phrases), size=count // 8 + 1)
    np.concatenate([phrases[i] for i in picks])[:count].astype(np.uint16).tofile(path)


# ---------------------------------------------------------------------------------- training
@dataclasses.dataclass
class RunConfig:
    backend: str = "CPU"
    out_dir: str = "out"
    dataset: str | None = None
    batch_size: int = 8
    num_steps: int = 20
    checkpoint_steps: int = 10
    learning_rate: float = 1e-3
    warmup_steps: int = 5
    weight_decay: float = 0.1
    max_gradient_norm: float = 1.0
    checkpoint_path: str | None = None
    seed: int = 0


def train(model_config: ModelConfig, config: RunConfig) -> list[tuple[int, float]]:
    """Runs (or resumes) training; returns the logged ``(step, loss)`` pairs."""
    os.makedirs(config.out_dir, exist_ok=True)
    dataset = config.dataset or os.path.join(config.out_dir, "train.bin")
    if config.dataset is None and not os.path.exists(dataset):
        write_synthetic_tokens(
            dataset,
            model_config.vocab_size,
            model_config.max_positions * config.batch_size * 16 + 1,
        )

    options = (
        {}
        if config.backend.upper() == "CPU"
        else {"cluster_config": cstorch.distributed.ClusterConfig()}
    )
    backend = cstorch.backend(config.backend, artifact_dir=config.out_dir, **options)
    if not backend.is_cpu:
        cstorch.amp.set_half_dtype("bfloat16")
    torch.manual_seed(config.seed)
    with backend.device:
        model = LanguageModel(model_config)
    compiled_model = cstorch.compile(model, backend)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = cstorch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.learning_rate,
        betas=(0.9, 0.95),
        eps=1e-8,
        correct_bias=True,
    )
    decay_steps = max(config.num_steps - config.warmup_steps, 1)
    scheduler = cstorch.optim.lr_scheduler.SequentialLR(
        optimizer,
        [
            cstorch.optim.lr_scheduler.LinearLR(
                optimizer,
                initial_learning_rate=0.0,
                end_learning_rate=config.learning_rate,
                total_iters=config.warmup_steps,
            ),
            cstorch.optim.lr_scheduler.CosineDecayLR(
                optimizer,
                initial_learning_rate=config.learning_rate,
                end_learning_rate=0.1 * config.learning_rate,
                total_iters=decay_steps,
            ),
        ],
        milestones=[config.warmup_steps],
    )

    global_step = 0
    if config.checkpoint_path:
        state = cstorch.load(config.checkpoint_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["lr_scheduler"])
        global_step = int(state["global_step"])
        logger.info("Resumed from %s at step %d", config.checkpoint_path, global_step)

    @cstorch.trace
    def training_step(input_ids, labels):
        loss = compiled_model(input_ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(decay + no_decay, config.max_gradient_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        return loss

    @cstorch.checkpoint_closure
    def save_checkpoint(step):
        path = os.path.join(config.out_dir, f"checkpoint_{step}.mdl")
        cstorch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "lr_scheduler": scheduler.state_dict(),
                "global_step": step,
                "model_config": dataclasses.asdict(model_config),
            },
            path,
        )
        logger.info("Saved %s", path)

    from cerebras.pytorch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=os.path.join(config.out_dir, "train"))
    logged = []

    @cstorch.step_closure
    def log(loss, step):
        rate = executor.profiler.rate_tracker.rate
        global_rate = executor.profiler.rate_tracker.global_rate
        logged.append((step, loss.item()))
        logger.info(
            "| Step=%d, Loss=%.5f, Rate=%.2f samples/sec, GlobalRate=%.2f samples/sec",
            step,
            loss.item(),
            rate,
            global_rate,
        )
        writer.add_scalar("loss", loss.item(), step)
        writer.add_scalar("samples_per_second", global_rate, step)

    dataloader = cstorch.utils.data.DataLoader(
        token_batches,
        dataset,
        model_config.max_positions,
        config.batch_size,
        config.seed,
        global_step,
    )
    executor = cstorch.utils.data.DataExecutor(
        dataloader,
        num_steps=config.num_steps - global_step,
        checkpoint_steps=config.checkpoint_steps,
    )
    for step, (input_ids, labels) in enumerate(executor, start=global_step + 1):
        loss = training_step(input_ids, labels)
        log(loss, step)
        save_checkpoint(step)
    writer.close()
    return logged


def parse_args(argv=None) -> tuple[ModelConfig, RunConfig]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for config_class in (ModelConfig, RunConfig):
        for field in dataclasses.fields(config_class):
            kind = {"int": int, "float": float}.get(str(field.type).split(" ")[0], str)
            parser.add_argument(
                f"--{field.name.replace('_', '-')}",
                dest=field.name,
                type=kind,
                default=field.default,
            )
    args = vars(parser.parse_args(argv))
    split = lambda cls: cls(**{f.name: args[f.name] for f in dataclasses.fields(cls)})  # noqa: E731
    return split(ModelConfig), split(RunConfig)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    train(*parse_args())
