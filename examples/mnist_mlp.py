"""The Cerebras docs' MNIST training loop, unchanged, on synthetic data (no download).

Run with ``make demo`` or ``python examples/mnist_mlp.py``. The images are random 28x28
pictures and the labels come from a fixed random "teacher", so the task is learnable and the
loss falls within a couple of hundred steps.
"""

import argparse

import torch

import cerebras.pytorch as cstorch


class MNISTModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 256)
        self.fc2 = torch.nn.Linear(256, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.fc2(torch.relu(self.fc1(x)))


def synthetic_mnist(batch_size, num_batches, seed=0):
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(784, 10, generator=g)
    images = torch.randn(batch_size * num_batches, 1, 28, 28, generator=g)
    labels = (images.flatten(1) @ teacher).argmax(1)
    dataset = torch.utils.data.TensorDataset(images, labels)
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, drop_last=True, generator=g
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--artifact-dir", default="./artifacts/demo")
    args = parser.parse_args()

    torch.manual_seed(0)
    backend = cstorch.backend("CPU", artifact_dir=args.artifact_dir)
    model = MNISTModel()
    compiled_model = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = cstorch.optim.lr_scheduler.CosineDecayLR(
        optimizer, initial_learning_rate=0.05, end_learning_rate=0.005, total_iters=args.steps
    )
    loss_fn = torch.nn.CrossEntropyLoss()

    @cstorch.trace
    def training_step(inputs, targets):
        outputs = compiled_model(inputs)
        loss = loss_fn(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        accuracy = (outputs.argmax(1) == targets).float().mean()
        return loss, accuracy

    @cstorch.step_closure
    def print_progress(loss, accuracy, step):
        if step % args.log_every == 0 or step == 1:
            print(
                f"step {step:4d}  loss {loss.item():.4f}  batch accuracy {accuracy.item():.2f}",
                flush=True,
            )

    dataloader = cstorch.utils.data.DataLoader(synthetic_mnist, args.batch_size, 50)
    executor = cstorch.utils.data.DataExecutor(dataloader, num_steps=args.steps)
    for step, (inputs, targets) in enumerate(executor, start=1):
        loss, accuracy = training_step(inputs, targets)
        print_progress(loss, accuracy, step)

    rate = executor.profiler.rate_tracker.global_rate
    print(
        f"done: {args.steps} steps, one compiled program (traced "
        f"{training_step.trace_count}x), {rate:.0f} samples/s"
    )


if __name__ == "__main__":
    main()
