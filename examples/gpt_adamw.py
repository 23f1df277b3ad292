"""A small GPT trained with AdamW, linear warmup + cosine decay and gradient clipping.

Synthetic data (each sequence counts up from a random start, so the model can learn it).
``--precision bfloat16`` trains in mixed precision; ``--precision float16`` adds dynamic loss
scaling. ``--backend CSX --num-csx 4 --weight-servers 1`` trains on the modeled wafer; started
with ``python -m cstorch.distributed.launch --num_processes 2 examples/gpt_adamw.py ...`` each
process streams its slice of every batch. Run ``python examples/gpt_adamw.py --help``.
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, heads, layers, seq):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied embeddings
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 / (math.sqrt(2 * layers) if "out" in name else 1))

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def counting_sequences(vocab, seq, batch, num_batches, seed=0):
    """The batches this process streams: its slice of each global batch of ``batch``."""
    share = cstorch.distributed.get_streaming_batch_size(batch)
    first = cstorch.distributed.get_streaming_rank() * share
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        tokens = (torch.randint(0, vocab, (batch, 1), generator=g) + torch.arange(seq + 1)) % vocab
        tokens = tokens[first : first + share]
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return batches


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument(
        "--precision", default="float32", choices=["float32", "bfloat16", "float16"]
    )
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch size")
    parser.add_argument("--artifact-dir", default="./artifacts/gpt")
    parser.add_argument("--backend", default="CPU", choices=["CPU", "CSX"])
    parser.add_argument("--num-csx", type=int, default=1, help="CSX: data-parallel systems")
    parser.add_argument(
        "--weight-servers",
        type=int,
        default=0,
        help="CSX: weight servers (shard parameters and optimizer state)",
    )
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()

    vocab, seq, batch, warmup = 256, args.seq_len, args.batch_size, max(args.steps // 10, 1)
    torch.manual_seed(0)
    if args.precision != "float32":
        cstorch.amp.set_half_dtype(args.precision)
    if args.backend == "CSX":
        backend = cstorch.backend(
            "CSX",
            artifact_dir=args.artifact_dir,
            cluster_config=cstorch.distributed.ClusterConfig(
                num_csx=args.num_csx, max_wgt_servers=args.weight_servers
            ),
        )
        cstorch.amp.enable_mixed_precision(args.precision != "float32")
    else:
        backend = cstorch.backend("CPU", artifact_dir=args.artifact_dir)
    model = GPT(vocab, args.d_model, 4, args.layers, seq)
    compiled_model = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = cstorch.optim.lr_scheduler.SequentialLR(
        optimizer,
        [
            cstorch.optim.lr_scheduler.LinearLR(
                optimizer, initial_learning_rate=0.0, end_learning_rate=3e-3, total_iters=warmup
            ),
            cstorch.optim.lr_scheduler.CosineDecayLR(
                optimizer,
                initial_learning_rate=3e-3,
                end_learning_rate=3e-4,
                total_iters=args.steps - warmup,
            ),
        ],
        milestones=[warmup],
    )
    grad_scaler = cstorch.amp.GradScaler(
        loss_scale="dynamic" if args.precision == "float16" else None
    )

    @cstorch.trace
    def training_step(inputs, targets):
        logits = compiled_model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        cstorch.amp.optimizer_step(loss, optimizer, grad_scaler, max_gradient_norm=1.0)
        scheduler.step()
        return loss

    @cstorch.step_closure
    def log(loss, lr, step):
        if step == 1 or step % args.log_every == 0:
            print(f"step {step:4d}  loss {loss.item():.6f}  lr {lr.item():.2e}", flush=True)

    dataloader = cstorch.utils.data.DataLoader(counting_sequences, vocab, seq, batch, 20)
    for step, (inputs, targets) in enumerate(
        cstorch.utils.data.DataExecutor(dataloader, num_steps=args.steps), start=1
    ):
        loss = training_step(inputs, targets)
        log(loss, optimizer.param_groups[0]["lr"], step)


if __name__ == "__main__":
    main()
