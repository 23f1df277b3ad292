"""``cbtorch.core.cb_model`` (``cm``): the 1.x process queries, step closures and step marks.

The answers describe this engine: one process is master, streamer and receiver at once (rank
0 of 1). ``use_cs()``, ``is_appliance()`` and ``is_wse_device()`` are true once the run was
initialized for the appliance (``cbtorch.initialize(appliance=True)``: the modeled wafer),
so the zoo takes its Cerebras branches (int32 labels, the appliance runner) exactly as on a
CS system; before that the process is a plain CPU/GPU run.

Step closures: on the appliance a closure is queued and runs at the next step mark
(``mark_step``: each ``cbtorch.dataloader`` iteration, or ``run_step_closures()``), when the
values it reads exist; off it (a CPU run) it runs at once, as 1.x did there.
"""

from __future__ import annotations

import functools
import logging
import time

import torch

import cstorch
from cerebras_pytorch.lazy import _run
from cstorch.utils.constant import make_constant  # noqa: F401
from cstorch.utils.nest import visit_torch_tensors

METRIC_NAME_PREFIX = "cerebras_metrics"  # where the saver keeps on-device metric state


# ----------------------------------------------------------------------- process queries
def use_cs() -> bool:
    return _run.current().appliance


def is_appliance() -> bool:
    return _run.current().appliance


def is_wse_device() -> bool:
    return _run.current().appliance


def is_sync_mode() -> bool:
    return True


def is_master_ordinal(local: bool = False) -> bool:
    return True


def is_streamer() -> bool:
    return True


def is_receiver() -> bool:
    return True


def get_streaming_rank() -> int:
    return 0


def get_ordinal() -> int:
    return 0


def num_tasks() -> int:
    return 1


def num_streamers() -> int:
    return 1


def num_receivers() -> int:
    return 1


def get_streaming_batch_size(effective_batch_size: int) -> int:
    """One system streams the whole batch (the zoo divides the effective batch by systems)."""
    return effective_batch_size


def set_target_num_replicas(num_replicas: int) -> None:
    if num_replicas not in (1, -1):
        logging.warning(f"num_replicas={num_replicas}: this engine runs one replica.")


def set_rng_state(seed) -> None:
    torch.manual_seed(seed)


def device():
    """The torch device the run's tensors live on, as 1.x's ``xm.xla_device()`` was a torch
    device: the zoo creates tensors on it (``torch.tensor(0, device=cm.device())`` in its
    metrics). The modeled wafer keeps its tensors in host memory: the CPU."""
    backend = cstorch.backend()
    return backend.device.torch_device if backend is not None else torch.device("cpu")


def to_cpu(tensor):
    if isinstance(tensor, torch.Tensor):
        return tensor.detach().cpu()
    return tensor


def to_device(tensor, device):
    return tensor.to(device)


# ------------------------------------------------------------------ run configuration
def set_run_config(total_steps, checkpoint_steps, fetch_steps, **kwargs) -> None:
    run = _run.current()
    run.settings.update(
        total_steps=total_steps, checkpoint_steps=checkpoint_steps, fetch_steps=fetch_steps
    )


def get_run_step() -> int:
    """The number of steps the appliance has run in this process."""
    return _run.current().run_step


def set_state_names(state_dict) -> None:
    """1.x named the graph's state tensors from the runner's state dict; the engine names its
    state by path itself, so the names are only recorded. Not the dict: its values share the
    weights' memory, and an alias kept for the whole run makes the engine write every step's
    state through to torch (``SharedStateWarning``)."""
    _run.current().state_names["state"] = [scope for scope, _ in visit_torch_tensors(state_dict)]


def set_metric_state_names(state_dict, name=None, *args, **kwargs) -> None:
    """A metric names its device state (the 1.7-1.9 weight-streaming metrics, each call):
    on the appliance it becomes state the steps carry (``RunState.name_metric_state``)."""
    _run.current().state_names.setdefault("metrics", {})[name] = state_dict
    if _run.current().appliance:
        from cerebras_pytorch.lazy.run_state import run_state

        run_state().name_metric_state(state_dict, name)


def set_attribute(tensor, name, value) -> None:
    """Compiler hints on a tensor (1.8/1.9): the engine has no use for them."""


# ----------------------------------------------------------------------- step closures
def step_closure(fn):
    """Decorator: ``fn(*args)`` runs once the step's values exist (see the module doc)."""

    @functools.wraps(fn)
    def queued(*args, **kwargs):
        run = _run.current()
        if run.appliance:
            run.closures.append((fn, args, kwargs))
        else:
            fn(*args, **kwargs)

    return queued


def run_step_closures() -> None:
    """Runs the queued step closures, oldest first (a closure may queue more)."""
    run = _run.current()
    while run.closures:
        fn, args, kwargs = run.closures.pop(0)
        fn(*args, **kwargs)


def mark_step() -> None:
    """The step boundary: the values of the step just traced exist, so its closures run."""
    run_step_closures()


# ------------------------------------------------------------------ logging, summaries
def print_update(device, step, loss, mode, summary_writer=None, **kwargs) -> None:
    if _run.current().appliance:  # the device is the host's; the run is the wafer's
        device = "CSX"
    logging.info(
        f"| {mode.capitalize()} Device={device}, Step={step}, Loss={loss:.5f}, "
        f"Time={time.strftime('%H:%M:%S')}"
    )
    if summary_writer is not None:
        summary_writer.add_scalar("loss", loss, step)


def write_to_summary(summary_writer, global_step, dict_to_write=None, **kwargs) -> None:
    if summary_writer is None:
        return
    for name, value in (dict_to_write or {}).items():
        summary_writer.add_scalar(name, value, global_step)


def print_metrics_report() -> None:
    """The PyTorch/XLA debug metrics report: there are no lazy-tensor counters to print."""


def metrics_counter_value(name):
    return None


def mesh_reduce(tag, data, reduce_fn):
    return reduce_fn([data])


def rendezvous(tag, payload=b"", replicas=None):
    """One ordinal: nothing to exchange (the zoo then uses its own payload)."""
    return []


def save(data, path, master_only=True, post_transfer_callback=None, **kwargs) -> None:
    """Saves ``data`` with its tensors brought to the host, as ``torch.save`` does (1.x's
    ``cm.save`` was PyTorch/XLA's save, a torch pickle: the 1.6 runner reads it back with
    ``torch.load``)."""
    host = _map_tensors(data, to_cpu)
    if post_transfer_callback is not None:
        host = post_transfer_callback(host)
    torch.save(host, path)


def _map_tensors(data, fn):
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, dict):
        return type(data)((k, _map_tensors(v, fn)) for k, v in data.items())
    if isinstance(data, (list, tuple)):
        return type(data)(_map_tensors(v, fn) for v in data)
    return data


class RateTracker:
    """Samples per second since the tracker started (1.x's XLA rate tracker)."""

    def __init__(self, smooth_factor=None):
        self._start = time.time()
        self._count = 0
        self._partial_count = 0

    def add(self, count):
        self._count += count

    def rate(self):
        return self._count / max(time.time() - self._start, 1e-9)

    def global_rate(self):
        return self.rate()


def _extract_tracker_details(step=None):
    """1.8/1.9: ``(rate, global_rate, batch_size)`` of the appliance run so far (samples per
    second; the batch size of the last step)."""
    mode = _run.current().appliance_mode
    tracker = getattr(mode, "throughput", None)
    if tracker is None:
        return 0.0, 0.0, 1
    return tracker.rate(), tracker.global_rate(), max(mode.last_batch_size, 1)
