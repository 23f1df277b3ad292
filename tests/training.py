"""The traced training step the state tests share: squared error, cstorch SGD with momentum."""

import cerebras.pytorch as cstorch


def compiled_sgd_step(model, backend, lr=0.1, momentum=0.9):
    """Compiles ``model`` on ``backend``; returns (its cstorch SGD, the traced step(x, y))."""
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)

    @cstorch.trace
    def step(x, y):
        loss = (compiled(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return optimizer, step
