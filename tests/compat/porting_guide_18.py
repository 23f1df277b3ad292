"""A training script written against the 1.8 experimental API, in the style of the 1.8
porting guide: configure, compile(backend="wse_ws"), configure_optimizer and a scheduler
list, dynamic loss scaling with clipping, a compiled step, step closures, save/load, and an
eval pass with an on-system accuracy metric. Tests import it and call ``main``."""

import os

import torch

import cerebras_pytorch.experimental as cstorch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(20, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def input_fn(params):
    g = torch.Generator().manual_seed(params["seed"])
    x = torch.randn(params["batch_size"] * 8, 20, generator=g)
    y = (x[:, :4] * 3).argmax(1)
    dataset = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(dataset, batch_size=params["batch_size"], drop_last=True)


def main(model_dir, backend="wse_ws", num_steps=12, checkpoint_steps=4):
    cstorch.configure(model_dir=model_dir, checkpoint_steps=checkpoint_steps, seed=1)

    model = MLP()
    compiled_model = cstorch.compile(model, backend=backend)
    loss_fn = torch.nn.CrossEntropyLoss()

    optimizer = cstorch.optim.configure_optimizer(
        optimizer_type="SGD",
        params=model.parameters(),
        learning_rate=0.1,
        momentum=0.9,
        weight_decay_rate=0.001,
    )
    lr_scheduler = cstorch.optim.configure_lr_scheduler(
        optimizer,
        [
            {
                "scheduler": "Linear",
                "initial_learning_rate": 0.02,
                "end_learning_rate": 0.1,
                "steps": 4,
            },
            {
                "scheduler": "CosineDecay",
                "initial_learning_rate": 0.1,
                "end_learning_rate": 0.01,
                "decay_steps": 8,
            },
        ],
    )
    grad_scaler = cstorch.amp.GradScaler(loss_scale="dynamic")

    @cstorch.compile_step
    def training_step(inputs, targets):
        loss = loss_fn(compiled_model(inputs), targets)
        cstorch.amp.optimizer_step(loss, optimizer, grad_scaler, max_gradient_norm=1.0)
        lr_scheduler.step()
        cstorch.scalar_summary("train/loss_scale", grad_scaler.get_scale())
        return loss

    losses, saved = [], []

    @cstorch.step_closure
    def record_loss(loss):
        losses.append(loss.item())

    @cstorch.step_closure
    def save_checkpoint(step):
        path = os.path.join(model_dir, f"checkpoint_{step}.mdl")
        cstorch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "grad_scaler": grad_scaler.state_dict(),
                "global_step": step,
            },
            path,
        )
        saved.append(path)

    params = {"batch_size": 16, "seed": 0}
    dataloader = cstorch.utils.data.DataLoader(input_fn, params, num_steps=num_steps)
    global_step = 0
    for _epoch in range(dataloader.num_epochs):
        for inputs, targets in dataloader:
            loss = training_step(inputs, targets)
            global_step += 1
            record_loss(loss)
            if global_step % checkpoint_steps == 0:
                save_checkpoint(global_step)

    # Evaluate the last checkpoint's weights with an on-system accuracy metric.
    state = cstorch.load(saved[-1])
    model.load_state_dict(state["model"])
    accuracy = cstorch.metrics.AccuracyMetric("accuracy", compute_on_system=True)

    @cstorch.compile_step
    def eval_step(inputs, targets):
        logits = compiled_model(inputs)
        accuracy(labels=targets, predictions=logits.argmax(-1))
        return loss_fn(logits, targets)

    eval_losses = []

    @cstorch.step_closure
    def record_eval(loss):
        eval_losses.append(loss.item())

    compiled_model.eval()
    eval_loader = cstorch.utils.data.DataLoader(input_fn, params, num_epochs=1)
    for inputs, targets in eval_loader:
        record_eval(eval_step(inputs, targets))
    metrics = dict(cstorch.metrics.compute_all_metrics())
    return {
        "losses": losses,
        "checkpoints": saved,
        "eval_losses": eval_losses,
        "metrics": metrics,
        "model": model,
    }
