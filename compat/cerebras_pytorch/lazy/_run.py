"""The one record of the process's 1.x run: what ``cbtorch.initialize`` was told, the
registered model and optimizer, the queued step closures and the run's step counter.

Before ``initialize(appliance=True)`` the process is a plain CPU/GPU run (``cm.use_cs()`` is
false and step closures run at once, as 1.x did off the Cerebras stack).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Run:
    appliance: bool = False  # initialize(appliance=True): the modeled wafer
    settings: dict = dataclasses.field(default_factory=dict)
    weight_streaming: bool = True
    modules: list = dataclasses.field(default_factory=list)
    optimizers: list = dataclasses.field(default_factory=list)
    closures: list = dataclasses.field(default_factory=list)  # (fn, args, kwargs)
    run_step: int = 0  # steps the appliance ran (cm.get_run_step)
    state_names: dict = dataclasses.field(default_factory=dict)
    appliance_mode: object = None  # the ApplianceMode of the run, once created
    dataloader: object = None  # the cbtorch.dataloader being iterated
    in_execution_loop: bool = False  # while that loader hands out batches
    run_state: object = None  # cbtorch.state(), once asked for


_current = Run()


def current() -> Run:
    return _current


def reset() -> None:
    """Forgets the run (``cstorch.config.reset()`` calls it: tests start each 1.x run from
    a fresh process state)."""
    global _current
    _current = Run()


def _register_reset() -> None:
    import cstorch

    cstorch.config.config.on_reset(reset)


_register_reset()
