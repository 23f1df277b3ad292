"""A tiny cstorch training script for parity-tool tests (an MLP, AdamW, a warmup schedule).

``--perturb-step K`` scales the inputs by 1.01 from step K on, only on the JAX engine: a
deliberately diverging run whose first bad step is K. ``--dropout P`` adds dropout (random
ops), ``--no-zero-grad`` leaves out ``optimizer.zero_grad()``, ``--precision bfloat16`` trains
in mixed precision, ``--save`` saves a checkpoint to the fixed path ``checkpoint.mdl`` (in the
working directory) after every step, ``--torch-optimizer`` steps torch's own
``torch.optim.AdamW`` (no schedule) instead of cstorch's AdamW and its warmup.
"""

import argparse

import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--perturb-step", type=int, default=0)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--no-zero-grad", action="store_true")
    parser.add_argument("--precision", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--torch-optimizer", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    if args.precision != "float32":
        cstorch.amp.set_half_dtype(args.precision)
    backend = cstorch.backend("CPU")
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.Tanh(),
        torch.nn.Dropout(args.dropout) if args.dropout else torch.nn.Identity(),
        torch.nn.Linear(16, 4),
    )
    compiled = cstorch.compile(model, backend)
    if args.torch_optimizer:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        scheduler = None
    else:
        optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        scheduler = cstorch.optim.lr_scheduler.LinearLR(
            optimizer, initial_learning_rate=1e-3, end_learning_rate=1e-2, total_iters=4
        )

    @cstorch.trace
    def training_step(inputs, targets):
        loss = F.cross_entropy(compiled(inputs), targets)
        if not args.no_zero_grad:
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return loss

    @cstorch.step_closure
    def log(loss, lr):
        print(f"loss {loss.item():.6f} lr {float(lr):.3e}")

    @cstorch.checkpoint_closure
    def save(path):
        cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g))
        for _ in range(args.steps)
    ]
    dataloader = cstorch.utils.data.DataLoader(lambda: batches)
    executor = cstorch.utils.data.DataExecutor(
        dataloader, num_steps=args.steps, checkpoint_steps=1 if args.save else None
    )
    for step, (inputs, targets) in enumerate(executor, start=1):
        if args.perturb_step and step >= args.perturb_step and backend.engine == "jax":
            inputs = inputs * 1.01
        loss = training_step(inputs, targets)
        log(loss, optimizer.param_groups[0]["lr"])
        if args.save:
            save("checkpoint.mdl")


if __name__ == "__main__":
    main()
