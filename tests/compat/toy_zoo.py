"""A Model Zoo 1.x style model for the runner tests: ``ToyModel(params)`` (an ``nn.Module``
whose call returns the loss, with an accuracy metric in eval), data functions of the params,
and the same training written in eager torch as the reference."""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from modelzoo.common.pytorch import cb_model as cm
from modelzoo.common.pytorch.metrics import AccuracyMetric


class Classifier(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(10, hidden)
        self.fc2 = nn.Linear(hidden, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class ToyModel(nn.Module):
    def __init__(self, params):
        super().__init__()
        self.model = Classifier(params["model"].get("hidden", 16))
        self.accuracy = AccuracyMetric(name="accuracy")
        self.loss_fn = nn.NLLLoss()

    def __call__(self, data):
        inputs, labels = data
        logits = self.model(inputs)
        if not self.training:
            self.accuracy(labels=labels.clone(), predictions=logits.argmax(-1))
        return self.loss_fn(F.log_softmax(logits, dim=1), labels)


def batches(seed, count, batch_size=8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(count * batch_size, 10, generator=g)
    y = (x[:, :3] * 2 + 0.3 * torch.randn(count * batch_size, 3, generator=g)).argmax(1)
    return [
        (x[i * batch_size : (i + 1) * batch_size], y[i * batch_size : (i + 1) * batch_size])
        for i in range(count)
    ]


def _loader(section, count):
    data = batches(section.get("seed", 0), count, section.get("batch_size", 8))
    if cm.use_cs():  # as Model Zoo data functions do on a Cerebras system
        data = [(x, y.to(torch.int32)) for x, y in data]
    return data


def train_data_fn(params):
    return _loader(params["train_input"], params["train_input"].get("num_batches", 6))


def eval_data_fn(params):
    return _loader(params["eval_input"], params["eval_input"].get("num_batches", 3))


def make_params(model_dir, **runconfig):
    params = {
        "train_input": {"batch_size": 8, "seed": 0, "num_batches": 6},
        "eval_input": {"batch_size": 8, "seed": 1, "num_batches": 3},
        "model": {"mixed_precision": False, "hidden": 16},
        "optimizer": {"optimizer_type": "SGD", "learning_rate": 0.1, "momentum": 0.9},
        "runconfig": {
            "mode": "train",
            "target_device": "CPU",
            "model_dir": str(model_dir),
            "max_steps": 6,
            "log_steps": 1,
            "seed": 1,
            "compile_only": False,
            "validate_only": False,
        },
    }
    params["runconfig"].update(runconfig)
    return params


def eager_losses(params, num_steps, lr_fn=None, initial_state=None, order=None):
    """Per-step losses of the 1.x PyTorchRunner loop in eager torch (SGD with momentum,
    loss divided by grad_accum_steps, optional norm clipping, LR from ``lr_fn(step)``).
    ``order`` lists the batch index of each micro-batch (default: epochs of the data)."""
    torch.manual_seed(params["runconfig"]["seed"])
    model = ToyModel(copy.deepcopy(params))
    if initial_state is not None:
        model.load_state_dict(initial_state)
    oparams = params["optimizer"]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=oparams["momentum"])
    accum = oparams.get("grad_accum_steps", 1)
    data = [(x, y.long()) for x, y in train_data_fn(params)]
    losses, it = [], 0
    for step in range(num_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_fn(step) if lr_fn else oparams["learning_rate"]
        optimizer.zero_grad()
        total = 0.0
        for _ in range(accum):
            index = order[it] if order else it % (len(data) // accum * accum)
            loss = model(data[index]) / accum
            it += 1
            loss.backward()
            total += loss.item()
        if oparams.get("max_gradient_norm"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), oparams["max_gradient_norm"])
        optimizer.step()
        losses.append(total)
    return losses, model
