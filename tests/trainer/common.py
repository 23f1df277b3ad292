"""The tiny problem the Trainer tests share: an MLP classifier whose forward returns its loss,
a synthetic dataset, and the same training written by hand in eager torch (the oracle)."""

import torch

import cerebras.pytorch as cstorch

IN, HIDDEN, CLASSES, BATCH = 8, 16, 4, 4


class ClassifierMLP(torch.nn.Module):
    """Takes a batch ``(x, y)`` and returns the cross-entropy loss, as Model Zoo models do."""

    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.fc1 = torch.nn.Linear(IN, hidden)
        self.fc2 = torch.nn.Linear(hidden, CLASSES)

    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.fc2(torch.relu(self.fc1(x))), y)


def seeded_model(seed):
    """The model a Trainer with ``seed=seed`` starts from: it is built inside the backend's
    device context, where (as in cerebras-pytorch) each random initialisation draws from a
    fresh generator seeded from the default one, so plain ``ClassifierMLP()`` after
    ``torch.manual_seed(seed)`` would start elsewhere."""
    torch.manual_seed(seed)
    with cstorch.device("CPU"):
        return ClassifierMLP()


def batches(num_batches, seed=0, start=0):
    """``num_batches`` fixed batches (batch ``start`` onwards of the seed's stream)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((start + num_batches) * BATCH, IN, generator=g)
    y = torch.randint(0, CLASSES, ((start + num_batches) * BATCH,), generator=g)
    x, y = x[start * BATCH :], y[start * BATCH :]
    return [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(x), BATCH)]


def torch_loader(num_batches, seed=0, start=0) -> torch.utils.data.DataLoader:
    """The input function of a ``cstorch.utils.data.DataLoader`` (declared to return one, so
    that a YAML config may name it)."""
    data = batches(num_batches, seed, start)
    x = torch.cat([b[0] for b in data])
    y = torch.cat([b[1] for b in data])
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)


LR, END_LR, MOMENTUM = 0.1, 0.01, 0.9


def eager_reference(seed, train, val=(), eval_every=None, total_iters=24):
    """Hand-written eager torch: SGD with momentum and a linear LR decay from LR to END_LR
    over ``total_iters`` steps; after every ``eval_every`` steps, the mean loss over ``val``.
    Returns (train losses, validation losses, final state_dict)."""
    model = seeded_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    train_losses, val_losses = [], []
    for step, batch in enumerate(train):
        for group in optimizer.param_groups:
            group["lr"] = LR + (END_LR - LR) * min(step, total_iters) / total_iters
        loss = model(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_losses.append(loss.item())
        if eval_every and (step + 1) % eval_every == 0:
            with torch.no_grad():
                val_losses.append(sum(model(b).item() for b in val) / len(val))
    return train_losses, val_losses, model.state_dict()
