"""``cerebras_pytorch.experimental``: the cstorch API of releases 1.8 and 1.9.

``import cerebras_pytorch.experimental as cstorch`` and a 1.8 porting-guide script runs
unchanged::

    cstorch.configure(model_dir=..., checkpoint_steps=..., ...)      # once per process
    compiled = cstorch.compile(model, backend="WSE_WS")              # or "CPU"
    optimizer = cstorch.optim.configure_optimizer("SGD", model.parameters(), ...)
    scheduler = cstorch.optim.configure_lr_scheduler(optimizer, [...])
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")

    @cstorch.compile_step                         # 2.0+: @cstorch.trace
    def train_step(inputs, targets):
        loss = loss_fn(compiled(inputs), targets)
        cstorch.amp.optimizer_step(loss, optimizer, scaler, max_gradient_norm=1.0)
        scheduler.step()
        return loss

    @cstorch.step_closure
    def log(loss): ...

    dataloader = cstorch.utils.data.DataLoader(input_fn, params, num_steps=100)
    for epoch in range(dataloader.num_epochs):
        for inputs, targets in dataloader:
            log(train_step(inputs, targets))

The WSE backend names run on the modeled wafer (cstorch's ``CSX`` backend, which always
trains in mixed precision); ``"CPU"`` runs in fp32. Everything else is cstorch's own object.
cstorch 2.10's ``experimental`` names (``Compression``, ``listener``, ...) are offered too.
"""

import cstorch as _cstorch
import cstorch.experimental as _experimental_2x
from cerebras_pytorch.experimental import amp, metrics, optim, utils
from cerebras_pytorch.experimental._backend19 import backend as backend, save as save  # (1.9)
from cerebras_pytorch.experimental._configure import compile, configure
from cerebras_pytorch.experimental.summaries import (
    save_summaries,
    scalar_summary,
    summarize_scalar,
)
from cstorch import load as load
from cstorch.core.compile import trace as compile_step
from cstorch.utils.step_closures import (
    checkpoint_closure as checkpoint_closure,
    step_closure as step_closure,
)

__all__ = [
    "amp",
    "backend",
    "checkpoint_closure",
    "compile",
    "compile_step",
    "configure",
    "load",
    "metrics",
    "optim",
    "save",
    "save_summaries",
    "scalar_summary",
    "step_closure",
    "summarize_scalar",
    "utils",
]


def __getattr__(name):
    for source in (_experimental_2x, _cstorch):
        if hasattr(source, name):
            return getattr(source, name)
    raise AttributeError(f"module 'cerebras_pytorch.experimental' has no attribute {name!r}")
