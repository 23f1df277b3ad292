"""The training step the state tests share: squared error, backward, an optimizer step."""

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
