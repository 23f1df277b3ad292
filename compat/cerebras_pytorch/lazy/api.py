"""The 1.x top-level ``cbtorch`` names (``import cerebras_pytorch as cbtorch``) that cstorch
does not have; ``cerebras_pytorch.__getattr__`` offers them.

``initialize(appliance=True, ...)`` turns the process into an appliance run on the modeled
wafer (cstorch's CSX backend); ``module``/``optimizer`` register the model and optimizer with
it; ``dataloader`` wraps a torch DataLoader so each iteration marks a step; ``state()`` and
``env()`` are the run's records the zoo reads and sets.
"""

from __future__ import annotations

import torch

import cstorch
from cerebras_pytorch.lazy import _run
from cerebras_pytorch.lazy.outputs import extract_loss
from cstorch.backend import get_or_create

__all__ = [
    "initialize",
    "module",
    "optimizer",
    "dataloader",
    "state",
    "env",
    "Session",
    "data",  # noqa: F822 (data: module __getattr__)
    "enable_debug_name_scope",
    "extract_loss",
]


class _Env:
    """``cbtorch.env()``: the settings of the run the zoo reads back."""

    def __init__(self):
        self.service_workdir = "."
        self.compile_dir = None
        self.compile_only = False

    @property
    def appliance(self) -> bool:
        """Whether the run is on the appliance (``initialize(appliance=True)``; 1.6's
        metrics read it)."""
        return _run.current().appliance

    @property
    def weight_streaming_mode(self) -> bool:
        return _run.current().weight_streaming

    @weight_streaming_mode.setter
    def weight_streaming_mode(self, value: bool) -> None:
        if not value:
            raise ValueError(
                "The pipeline execution strategy is not modeled: this engine "
                "runs weight streaming only. Leave execution_strategy unset or "
                "set it to weight_streaming."
            )
        _run.current().weight_streaming = True


_env = _Env()


def env() -> _Env:
    return _env


def initialize(
    service_workdir=".",
    compile_dir=None,
    compile_only=False,
    appliance=False,
    use_appliance_data=True,
    use_cbfloat16=False,
    log_initialization=True,
    **kwargs,
):
    """Starts the 1.x run. ``appliance=True`` (the zoo's CSX path) runs on the modeled
    wafer; the engine needs no service or compile directory (they are recorded)."""
    if not appliance:
        raise ValueError(
            "cbtorch.initialize: only appliance=True (the weight-streaming "
            "appliance flow) is modeled; a CPU run does not call initialize."
        )
    if compile_only:
        raise ValueError(
            "compile_only/validate_only are not offered by the 1.x appliance "
            "flow here; use the cstorch API (runconfig.experimental_api) for a "
            "compile-only run."
        )
    if use_cbfloat16:
        raise ValueError(
            "use_cbfloat16 is not modeled in the 1.x flow; leave it off (the "
            "modeled wafer computes in float16 mixed precision)."
        )
    run = _run.current()
    run.appliance = True
    run.settings.update(service_workdir=service_workdir, compile_dir=compile_dir, **kwargs)
    _env.service_workdir = service_workdir
    _env.compile_dir = compile_dir
    get_or_create(
        "CSX",
        artifact_dir=f"{service_workdir}/cerebras_logs",
        compile_dir=compile_dir or "cached_compile",
    )
    # 1.6's zoo imports two pieces of PyTorch/XLA on a CS system: importable from now on,
    # until the run is reset (see xla_pieces: never visible outside a 1.x appliance run)
    from cerebras_pytorch.lazy import xla_pieces

    xla_pieces.serve()


def module(model: torch.nn.Module, device=None) -> torch.nn.Module:
    """Registers the model with the run's backend and returns it (its parameters stay the
    module's own tensors, so the zoo's optimizer and state dicts see them)."""
    _require_appliance("cbtorch.module")
    cstorch.compile(model, cstorch.backend())
    _run.current().modules.append(model)
    return model


def optimizer(opt):
    """Registers a torch optimizer with the run and returns the 1.x wrapper the zoo expects
    (``cbtorch.optim.Optimizer``)."""
    _require_appliance("cbtorch.optimizer")
    from cerebras_pytorch.lazy.optim import LazyOptimizer

    wrapped = LazyOptimizer(opt)
    _run.current().optimizers.append(wrapped)
    return wrapped


def dataloader(loader, use_parallel_loader=False, **kwargs):
    from cerebras_pytorch.lazy.data import DataLoader

    return DataLoader(loader)


def state():
    from cerebras_pytorch.lazy.run_state import run_state

    return run_state()


class Session:
    """1.x ``cbtorch.Session``: a context for a pipeline-mode run, which is not modeled."""

    def __init__(self, *args, **kwargs):
        raise ValueError(
            "cbtorch.Session is the pipeline-mode (non-appliance) session; this "
            "engine runs the appliance flow only (execution_strategy "
            "weight_streaming)."
        )


def enable_debug_name_scope(*args, **kwargs) -> None:
    """Debug names for the compiler: nothing to enable here."""


def is_ltc_mlir_mode_enabled() -> bool:
    """1.9: whether the LTC/MLIR flow was switched on; the zoo then takes its cstorch flow.
    Here that flow is chosen by ``runconfig.experimental_api`` alone."""
    return False


def _require_appliance(what: str) -> None:
    if not _run.current().appliance:
        raise RuntimeError(
            f"{what} needs an appliance run: call cbtorch.initialize(appliance=True, ...) first."
        )


def __getattr__(name):
    if name == "data":
        from cerebras_pytorch.lazy import data

        return data
    raise AttributeError(f"module 'cerebras_pytorch.lazy.api' has no attribute {name!r}")
