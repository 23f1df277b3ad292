"""The training step the state tests share: squared error, backward, an optimizer step."""

import torch

import cerebras.pytorch as cstorch


def squared_error_step(forward, optimizer):
    """step(x, y) training ``forward`` (a module, compiled or eager) with ``optimizer``."""

    def step(x, y):
        loss = (forward(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return step


def compiled_sgd_step(model, backend, lr=0.1, momentum=0.9):
    """Compiles ``model`` on ``backend``; returns (its cstorch SGD, the traced step(x, y))."""
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    return optimizer, cstorch.trace(squared_error_step(compiled, optimizer))


def sgd_linear_mse_step():
    """A seeded ``Linear(3, 2)`` on the CPU backend with cstorch SGD (lr 0.1, momentum 0.9)
    and an MSE loss: (model, traced step(x, y)). The export tests and the generator of their
    old-JAX fixture (tests/data/make_old_export.py) train this same step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @cstorch.trace
    def training_step(x, y):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return model, training_step
