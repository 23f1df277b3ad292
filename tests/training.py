"""The training step the state tests share: squared error, backward, an optimizer step."""

import torch

import cerebras.pytorch as cstorch


def minimizing(loss_of, optimizer):
    """step(*inputs): one training step of ``optimizer`` on the loss ``loss_of(*inputs)``
    (zero_grad, backward, step); returns the loss. Trace it with ``cstorch.trace``."""

    def step(*inputs):
        loss = loss_of(*inputs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return step


def descending(loss_of, parameters, lr=0.1):
    """step(*inputs): the loss ``loss_of(*inputs)``, its backward, and plain gradient descent
    in place on the tensors ``parameters()`` gives (their grads cleared after); returns the
    loss. No optimizer object: for steps captured below cstorch (``capture_step``)."""

    def step(*inputs):
        loss = loss_of(*inputs)
        loss.backward()
        with torch.no_grad():
            for p in parameters():
                p.sub_(lr * p.grad)
                p.grad = None
        return loss

    return step


def squared_error_step(forward, optimizer):
    """step(x, y) training ``forward`` (a module, compiled or eager) with ``optimizer``."""
    return minimizing(lambda x, y: (forward(x) - y).pow(2).mean(), optimizer)


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


def lr_recording_step(compiled, optimizer, scheduler):
    """(a traced step(x) training ``compiled`` on its output's sum with ``optimizer`` and
    stepping ``scheduler``, the list a step closure appends the learning rate to after each
    step): the rates a schedule gives, as a script's closure sees them."""
    seen = []

    @cstorch.step_closure
    def record(lr):
        seen.append(float(lr))

    @cstorch.trace
    def training_step(x):
        loss = minimizing(lambda x: compiled(x).sum(), optimizer)(x)
        scheduler.step()
        record(optimizer.param_groups[0]["lr"])
        return loss

    return training_step, seen


def linear_mse_batch(i):
    """Batch ``i`` (inputs (4, 3), targets (4, 2)) of ``sgd_linear_mse_step``'s data, seeded."""
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 3, generator=g), torch.randn(4, 2, generator=g)
