"""An ordinary CNN for parity-tool tests (issue 31): a convolution with a bias before
BatchNorm, AdamW, fp32. The bias's gradient is zero in exact arithmetic (BatchNorm removes
any per-channel shift), so what it gets is rounding noise, which Adam scales to full-size
steps: eager torch itself cannot reproduce that tensor's final state, on any engine.

``--wrong-lowering`` makes the JAX engine lower ReLU wrongly (a leak of 1e-3 below zero): a
real divergence, which the tool must still report.
"""

import argparse

import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch


def inject_wrong_relu():
    import jax.numpy as jnp

    from jax_backend import registry

    aten = torch.ops.aten
    registry._LOWERINGS[aten.relu.default] = registry.Lowering(
        lambda x: jnp.where(x > 0, x, x * 1e-3), False
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--wrong-lowering", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    backend = cstorch.backend("CPU")
    if args.wrong_lowering and backend.engine == "jax":
        inject_wrong_relu()
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, stride=2, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)

    @cstorch.trace
    def training_step(inputs, targets):
        loss = F.cross_entropy(compiled(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    @cstorch.step_closure
    def log(loss):
        print(f"loss {loss.item():.6f}")

    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(8, 3, 10, 10, generator=g), torch.randint(0, 4, (8,), generator=g))
        for _ in range(args.steps)
    ]
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: batches), num_steps=args.steps
    )
    for inputs, targets in executor:
        log(training_step(inputs, targets))


if __name__ == "__main__":
    main()
