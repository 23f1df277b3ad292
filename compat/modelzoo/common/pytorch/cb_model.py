"""``cb_model``: the process queries that Model Zoo 1.x model and data code imports
(``from modelzoo.common.pytorch import cb_model as cm``).

The answers describe this engine: one process is master, streamer and receiver at once
(rank 0 of 1); ``is_appliance()``/``is_wse_device()`` are true while the run targets the
modeled wafer (the cstorch ``CSX`` backend), and ``use_cs()`` with them, so data functions
take their Cerebras branches (e.g. int32 labels) exactly as on a CS system.
"""

from __future__ import annotations

import torch

import cstorch

# One process is master, streamer and receiver at once: the 1.x lazy API's answers.
from cerebras_pytorch.lazy.cb_model import (  # noqa: F401
    get_ordinal,
    get_streaming_rank,
    is_master_ordinal,
    is_receiver,
    is_streamer,
    num_receivers,
    num_streamers,
    num_tasks,
)
from cstorch.utils.constant import make_constant  # noqa: F401
from cstorch.utils.step_closures import step_closure  # noqa: F401


def _on_wafer() -> bool:
    return cstorch.use_cs()


def use_cs() -> bool:
    return _on_wafer()


def is_appliance() -> bool:
    return _on_wafer()


def is_wse_device() -> bool:
    return _on_wafer()


def set_rng_state(seed) -> None:
    torch.manual_seed(seed)


def to_cpu(tensor):
    """The tensor's value on the host (a compiled step's output is materialized)."""
    impl = cstorch.backend.current_backend_impl(raise_exception=False)
    return impl.to_cpu(tensor) if impl is not None else tensor


def to_device(tensor, device):
    return tensor.to(device)
