"""Evaluation with cstorch, in the style of the Cerebras docs' "Full Example (Evaluation)".

A small classifier is trained for a few steps on synthetic data, saved with ``cstorch.save``,
loaded back, and evaluated: the eval step is compiled once and an ``AccuracyMetric``
accumulates over the run. Run: ``python examples/eval_accuracy.py``.
"""

import os
import tempfile

import torch

import cerebras.pytorch as cstorch

NUM_CLASSES, FEATURES, BATCH = 4, 16, 32


def make_dataset(num_samples, seed):
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(NUM_CLASSES, FEATURES, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, NUM_CLASSES, (num_samples,), generator=generator)
    inputs = centers[labels] + torch.randn(num_samples, FEATURES, generator=generator)
    return torch.utils.data.TensorDataset(inputs, labels)


def input_fn(num_samples, seed):
    return torch.utils.data.DataLoader(
        make_dataset(num_samples, seed), batch_size=BATCH, shuffle=False, drop_last=True
    )


def main(artifact_dir):
    backend = cstorch.backend("CPU", artifact_dir=artifact_dir)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, NUM_CLASSES)
    )
    compiled_model = cstorch.compile(model, backend)
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    # ---------------------------------------------------------------- a short training run
    @cstorch.trace
    def train_step(batch):
        inputs, targets = batch
        loss = loss_fn(compiled_model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    checkpoint = os.path.join(artifact_dir, "checkpoint.mdl")

    @cstorch.checkpoint_closure
    def save_checkpoint():
        cstorch.save({"model": model.state_dict()}, checkpoint)

    train_loader = cstorch.utils.data.DataLoader(input_fn, 640, seed=1)
    model.train()
    for batch in cstorch.utils.data.DataExecutor(train_loader, num_steps=20, checkpoint_steps=20):
        train_step(batch)
        save_checkpoint()

    # ---------------------------------------------------------------- evaluation
    state_dict = cstorch.load(checkpoint)
    model.load_state_dict(state_dict["model"])

    accuracy = cstorch.metrics.AccuracyMetric("accuracy")

    @cstorch.trace
    @torch.no_grad()
    def eval_step(batch):
        inputs, targets = batch
        outputs = compiled_model(inputs)
        accuracy(labels=targets.clone(), predictions=outputs.argmax(-1).int())
        return loss_fn(outputs, targets)

    @cstorch.step_closure
    def post_eval_step(loss):
        losses.append(loss.item())

    losses = []
    eval_loader = cstorch.utils.data.DataLoader(input_fn, 320, seed=2)
    executor = cstorch.utils.data.DataExecutor(eval_loader, num_steps=len(eval_loader))
    model.eval()
    for batch in executor:
        loss = eval_step(batch)
        post_eval_step(loss)

    print(f"Eval loss: {sum(losses) / len(losses):.4f}")
    print(f"Accuracy: {float(accuracy)}")
    return float(accuracy)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        main(directory)
