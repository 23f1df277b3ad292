"""The MNIST example written with the Model Zoo Trainer instead of a hand-written loop.

Run ``python examples/trainer_mnist.py`` (Python API), or the same run from YAML:
``python -m cerebras.modelzoo.trainer fit examples/trainer_mnist.yaml`` from the repository
root (add ``--device CSX`` for the modeled wafer). Data is synthetic, as in ``mnist_mlp.py``.
"""

import argparse

import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer import Trainer
from cerebras.modelzoo.trainer.callbacks import Checkpoint, TrainingLoop
from cerebras.modelzoo.trainer.loggers import ProgressLogger, TensorBoardLogger


class MNISTClassifier(torch.nn.Module):
    """Model Zoo models take the whole batch and return the loss."""

    def __init__(self, hidden=256):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, hidden)
        self.fc2 = torch.nn.Linear(hidden, 10)

    def forward(self, batch):
        images, labels = batch
        logits = self.fc2(torch.relu(self.fc1(torch.flatten(images, 1))))
        return torch.nn.functional.cross_entropy(logits, labels)


def synthetic_mnist(batch_size=64, num_batches=50, seed=0) -> torch.utils.data.DataLoader:
    """Random images labelled by a fixed random "teacher" (learnable, no download); ``seed``
    picks the images, so training and validation sets share the teacher."""
    teacher = torch.randn(784, 10, generator=torch.Generator().manual_seed(1234))
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch_size * num_batches, 1, 28, 28, generator=g)
    labels = (images.flatten(1) @ teacher).argmax(1)
    dataset = torch.utils.data.TensorDataset(images, labels)
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, drop_last=True, generator=g
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="CPU", choices=["CPU", "GPU", "CSX"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--model-dir", default="./model_dir/trainer_mnist")
    args = parser.parse_args()

    trainer = Trainer(
        device=args.device,
        model_dir=args.model_dir,
        model=MNISTClassifier,
        optimizer=lambda model: cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        schedulers=[
            lambda optimizer: cstorch.optim.lr_scheduler.CosineDecayLR(
                optimizer,
                initial_learning_rate=0.05,
                end_learning_rate=0.005,
                total_iters=args.steps,
            )
        ],
        loop=TrainingLoop(num_steps=args.steps, eval_frequency=args.steps // 2, eval_steps=10),
        checkpoint=Checkpoint(steps=args.steps // 2),
        loggers=[ProgressLogger(), TensorBoardLogger()],
        seed=0,
    )
    trainer.fit(
        cstorch.utils.data.DataLoader(synthetic_mnist, 64, 50),
        cstorch.utils.data.DataLoader(synthetic_mnist, 64, 10, seed=1),
    )
    print(f"done: global step {trainer.global_step}, summaries in {trainer.summary_dir}")


if __name__ == "__main__":
    main()
