"""``cbtorch.state()``: what the 1.x runner and the zoo's metrics record and read during an
appliance run (the outputs they fetch, the metrics' device state and host callbacks), and
1.x's timing ``Tracker``. The appliance (``appliance.py``) runs the steps and fills in the
values."""

from __future__ import annotations

import contextlib
import time

import torch

import cstorch
from cerebras_appliance.pb.stack.full_pb2 import FullConfig
from cerebras_pytorch.lazy import _run


class Tracker:
    """1.x's timing tracker (``tracker_execute``): records named phases' wall times."""

    def __init__(self):
        self.times = {}
        self._started = {}

    def start(self, name):
        self._started[name] = time.time()

    def stop(self, name):
        if name in self._started:
            self.times[name] = time.time() - self._started.pop(name)

    @contextlib.contextmanager
    def entry(self, name):
        self.start(name)
        try:
            yield
        finally:
            self.stop(name)


class RunState:
    """``cbtorch.state()``: what the 1.x runner records and reads during the run."""

    def __init__(self):
        self.init_tracker = Tracker()
        self.progress_tracker = None  # 1.9's initialization progress bar: none shown here
        self.rate_tracker = None
        # the stack's configuration: the zoo's models set compiler hints on it (read by
        # nothing here), so it is a message to write to, as on a Cerebras install
        self.full_config = FullConfig()
        self.outputs = []
        self.num_csx = 1
        self.mixed_precision = False  # 1.6's eval reads it; amp state is not device state
        self.metrics = []
        # the 1.7-1.9 metrics on the appliance: device outputs and host callbacks of the
        # iteration being traced, and the device state of each (id -> (tensor, initial))
        self.device_outputs = []
        self.activation_callbacks = []
        self.metric_state = {}

    @property
    def is_inside_execution_loop(self) -> bool:
        """Whether the run's ``cbtorch.dataloader`` is handing out batches (the 1.x metrics
        must be created before)."""
        return _run.current().in_execution_loop

    @property
    def modules(self):
        """The modules registered with ``cbtorch.module`` (1.6's eval names their state)."""
        return list(_run.current().modules)

    def register_metric(self, metric) -> None:
        """1.6's metrics register themselves with the run when built for a CS system."""
        self.metrics.append(metric)

    def set_num_csx(self, num_csx) -> None:
        if num_csx not in (None, 1):
            raise ValueError(
                f"num_csx={num_csx}: this engine models one CS system; set num_csx to 1."
            )

    def track_object(self, obj, force: bool = False) -> None:
        """The runner and the metrics name the outputs the host will fetch. The step's loss
        is the one the 1.x runners fetch; a metric's device outputs (``{"cb_metric": {name:
        [args, kwargs]}}``) become outputs of the compiled step, fetched after every step
        for the metric's activation callbacks."""
        self.outputs.append(obj)
        if isinstance(obj, dict) and isinstance(obj.get("cb_metric"), dict):
            from cstorch.utils.nest import visit_torch_tensors

            self.device_outputs += [t for _, t in visit_torch_tensors(obj["cb_metric"])]

    def register_activation_callback(self, callback) -> None:
        """A metric's host part: called after every step, once the step's outputs arrived
        (it reads them with ``get_activation_for_output``)."""
        self.activation_callbacks.append(callback)

    def name_metric_state(self, state_dict: dict, name: str) -> None:
        """``cm.set_metric_state_names``: a weight-streaming metric's state tensors live on
        the device, updated in place by every step. They become backend state (carried from
        step to step), and their values now, before the metric first updates them, are the
        values the run starts from (the first, eager iteration's update is discarded, as
        the appliance started from the initial state file holding these values)."""
        from cstorch.backend import current_backend_impl
        from cstorch.utils.nest import visit_torch_tensors

        impl = current_backend_impl(raise_exception=False)
        if impl is None or impl.is_tracing:  # the trace meets the state registered before
            return
        for _, tensor in visit_torch_tensors(state_dict):
            if id(tensor) in self.metric_state:
                continue
            if not tensor.untyped_storage().resizable():
                # The runner wrote it into the initial state file through numpy, which marks
                # its memory as possibly shared with an array; as state it gets memory of
                # its own (the same value), so steps need not write through to that array.
                tensor.data = tensor.detach().clone()
            self.metric_state[id(tensor)] = (cstorch.tensor(tensor), tensor.detach().clone())

    def restore_metric_state(self) -> None:
        """Puts every metric state tensor back to the value it had when first named."""
        with torch.no_grad():
            for tensor, initial in self.metric_state.values():
                tensor.copy_(initial)

    def get_activation_for_output(self, tensor):
        mode = _run.current().appliance_mode
        if mode is None or mode.last_loss is None:
            raise RuntimeError(
                "No step has run on the appliance yet: call receive_activations(step) first."
            )
        return mode.activation(tensor)


def run_state() -> RunState:
    run = _run.current()
    if run.run_state is None:
        run.run_state = RunState()
    return run.run_state
