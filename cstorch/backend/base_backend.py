"""``BaseBackend``: a backend implementation as the reference API expects it, a facade over
parts that each do one job (the shape of Lightning's ``trainer/connectors``):

* ``registry`` (``Registry``, ``registry.py``): the registered models, optimizers,
  schedulers, grad scalers, metrics, sparsity algorithms and other stateful objects, the slots
  of their state and the cached ``StateView`` of them (``state_view.py``);
* ``trace`` (``TraceScope``, ``trace_scope.py``): what holds while a step body is traced;
* ``modes`` (``ModesAndHooks``, ``modes_and_hooks.py``): what of the models selects a
  compiled program (modes, hooks, ``requires_grad``), and the gradient bookkeeping;
* ``closures`` (``ClosureQueue``, ``closure_queue.py``): step and checkpoint closures;
* ``executors`` (``ExecutorLifecycle``, ``executor_lifecycle.py``): the running data
  executors and the backend's work at their boundaries.

The facade keeps the reference's names (``setup_model``, ``register_optimizer``,
``optimizer_registry``, ``add_step_closure``, ``run_step_closures``, ``on_run_start``,
``data_executor_stack``, ...), which delegate, and owns what belongs to the whole backend: its
devices, the device state, the seeds of random ops and the persistent compilation cache.
cstorch's own code takes the part it uses.

State lives on the JAX side between steps (``jax_backend.DeviceState``). The torch objects
(parameters, optimizer state, ...) are brought up to date only when someone asks:
``state_dict()`` of a compiled model or optimizer, a checkpoint closure, any torch access to
a state tensor, or ``materialize_state()``; the end of a data executor's run brings up to date
only the tensors that could be read without such an access (``on_run_end``).
"""

from __future__ import annotations

import contextlib
import weakref

import torch

import jax_backend
from cstorch.backend import precision, run_hooks
from cstorch.backend.closure_queue import ClosureQueue
from cstorch.backend.executor_lifecycle import ExecutorLifecycle
from cstorch.backend.modes_and_hooks import ModesAndHooks
from cstorch.backend.registry import Registry
from cstorch.backend.state_view import StateView
from cstorch.backend.trace_scope import TraceScope
from jax_backend import DeviceState, LazyTensor, materialize, shared_memory
from jax_backend.errors import CstorchTypeError
from jax_backend.user_frames import warn


def warn_cluster_config_ignored(backend_name: str, cluster_config) -> None:
    """Scripts written for CSX (e.g. gigaGPT) pass ``cluster_config`` to every backend; off
    CSX it has no meaning. cerebras-pytorch 2.10 raises TypeError; we accept it and say so."""
    if cluster_config is None:
        return
    from cstorch.distributed.cluster_config import ClusterConfig

    if not isinstance(cluster_config, ClusterConfig):
        raise CstorchTypeError(
            f"cluster_config must be a cstorch.distributed.ClusterConfig, got "
            f"{type(cluster_config).__name__}."
        )
    warn(
        f"The {backend_name} backend ignores cluster_config (it only configures CSX runs).",
        UserWarning,
    )  # at the cstorch.backend(...) call


def _part(part: str, name: str, settable: bool = False) -> property:
    """The facade's attribute ``name``: the part's (``self.<part>.<name>``)."""

    def get(self):
        return getattr(getattr(self, part), name)

    def set_(self, value):
        setattr(getattr(self, part), name, value)

    return property(get, set_ if settable else None, doc=f"``{part}.{name}``")


class BaseBackend:
    engine = "jax"  # how traced steps run (cstorch.core.engine); the CPU backend can be eager

    def __init__(self, backend_type, device, artifact_dir, jax_devices, layout=None):
        self.backend_type = backend_type
        self.device = device
        self.artifact_dir = artifact_dir
        self.jax_devices = list(jax_devices)
        self.layout = layout  # jax_backend.mesh.Layout of a multi-device (CSX) run, else None
        self.registry = Registry()
        self.trace = TraceScope(self.registry.grad_scalers)
        self.modes = ModesAndHooks(self.registry, self.trace)
        self.closures = ClosureQueue(self)
        self.executors = ExecutorLifecycle(self)
        self.device_state = self._new_device_state()
        self._holds_compilation_cache = False
        self._next_model_id = 0
        # A parameter or buffer registered on any module may be state. Bound to the backend,
        # which the graph cache's fingerprint names without walking it (the registry changes
        # while a step is traced).
        self._registration_hooks = [
            torch.nn.modules.module.register_module_parameter_registration_hook(
                self.invalidate_state_view
            ),
            torch.nn.modules.module.register_module_buffer_registration_hook(
                self.invalidate_state_view
            ),
        ]

    # ------------------------------------------------------------------ the parts' names
    models = _part("registry", "models")
    optimizer_registry = _part("registry", "optimizers")
    schedulers = _part("registry", "schedulers")
    grad_scalers = _part("registry", "grad_scalers")
    metrics = _part("registry", "metrics")
    stateful_objects = _part("registry", "stateful_objects")
    sparsity_registry = _part("registry", "sparsity")
    is_tracing = _part("trace", "is_tracing")
    mode = _part("modes", "mode")
    step_closures = _part("closures", "queued", settable=True)
    data_executor_stack = _part("executors", "stack")
    data_executor = _part("executors", "current")
    run_context = _part("executors", "run_context")
    appliance_tracker = _part("executors", "appliance_tracker")
    compilations = _part("executors", "compilations")
    last_step_outputs = _part("executors", "last_step_outputs", settable=True)

    # ------------------------------------------------------------------ properties
    @property
    def torch_device(self) -> torch.device:
        return self.device.torch_device

    @property
    def is_csx(self) -> bool:
        return self.backend_type.is_csx

    @property
    def is_e2e_execution(self) -> bool:
        return True

    def precision_policy(self) -> jax_backend.Policy:
        return precision.current_policy()

    # ------------------------------------------------------------------ registration
    def _new_device_state(self) -> DeviceState:
        state = DeviceState(self.jax_devices[0], self.layout)
        state.name_of = self.state_name
        return state

    def state_name(self, tensor) -> str | None:
        """How messages name a state tensor (``cstorch.core.state_names``)."""
        from cstorch.core.state_names import state_name  # cstorch.core imports this module

        view = self.registry.cached_view
        path = view.path_of(tensor) if view is not None else None
        return state_name(path) if path is not None else None

    def setup_model(self, model: torch.nn.Module) -> int:
        # What can be seen of its memory now: a storage that is resizable here has no numpy
        # array behind it, whatever exports it later (jax_backend.shared_memory).
        shared_memory.note_resizable([*model.parameters(), *model.buffers()])
        if self.registry.add_model(model):
            for module in model.modules():
                module.register_state_dict_pre_hook(BackendHook(self, "_state_dict_pre_hook"))
            model.register_load_state_dict_post_hook(BackendHook(self, "invalidate_state_view"))
            run_hooks.model_registered(model)
        try:  # as the reference: compiled models know their device
            model.device = self.torch_device
        except AttributeError:
            pass  # a read-only `device` property of its own (HF models): it already tells
        model_id = self._next_model_id
        self._next_model_id += 1
        return model_id

    def gradients_reset(self, parameters, set_to_none: bool) -> None:
        """A ``zero_grad`` of an optimizer or compiled module (``ModesAndHooks``)."""
        self.modes.gradients_reset(parameters, set_to_none)

    def _state_dict_pre_hook(self, module, prefix, keep_vars):
        self.materialize_state()

    def register_optimizer(self, optimizer) -> None:
        self.registry.add_optimizer(optimizer)
        # load_state_dict replaces the optimizer's state dicts wholesale.
        optimizer.register_load_state_dict_post_hook(BackendHook(self, "invalidate_state_view"))

    def setup_scheduler(self, scheduler) -> None:
        self.registry.add_scheduler(scheduler)

    def setup_grad_scaler(self, scaler) -> None:
        self.registry.add_grad_scaler(scaler)

    def register_metric(self, metric) -> None:
        self.registry.add_metric(metric)

    def register_stateful(self, obj) -> None:
        self.registry.add_stateful(obj)

    def setup_sparsity(self, sparsity) -> None:
        """Registers a ``cstorch.sparse`` algorithm (``Registry.add_sparsity``)."""
        self.registry.add_sparsity(sparsity)

    # ------------------------------------------------------------------ state
    def invalidate_state_view(self, *args, **kwargs) -> None:
        """The set of state tensors may have changed (a hook's arguments are ignored)."""
        self.registry.state_changed()

    def state_view(self) -> StateView:
        """The current state slots and unique state tensors (``Registry.state_view``)."""
        return self.registry.state_view(self.device_state)

    def materialize_state(self) -> None:
        """Brings every torch state tensor up to date with its device value."""
        self.device_state.materialize()

    @staticmethod
    def draw_seed() -> int:
        """A step's PRNG seed, drawn from torch's default generator: torch.manual_seed governs
        the randomness of compiled steps as it does eager dropout."""
        return int(torch.empty((), dtype=torch.int64).random_())

    def to_cpu(self, tensor):
        return tensor.materialize() if isinstance(tensor, LazyTensor) else tensor

    # ------------------------------------------------------------------ tracing
    def at_trace_exit(self, callback) -> None:
        self.trace.at_trace_exit(callback)

    def forward(self, model, *args, **kwargs):
        self.trace.model_used(model)
        return model(*args, **kwargs)

    # ------------------------------------------------------------------ closures
    def add_step_closure(self, kind: str, fn, args, kwargs) -> None:
        self.closures.add(kind, fn, args, kwargs)

    def run_step_closures(self) -> None:
        """Runs the queued closures (``ClosureQueue.run_queued``)."""
        self.closures.run_queued()

    def fetch_closure_values(self, values):
        """Step-closure arguments with their device values brought to the host."""
        return materialize(values)

    # ------------------------------------------------------------------ executor hooks
    def on_run_start(self) -> None:
        self.executors.on_run_start()

    def on_run_end(self) -> None:
        self.executors.on_run_end()

    def on_batch_start(self, batch):
        return batch

    def on_batch_end(self) -> None:
        self.executors.on_batch_end()

    def name_scope(self, name: str):
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ lifetime
    def shutdown(self) -> None:
        """Releases device state and global hooks (used when a test tears the backend down)."""
        self.closures.queued = []
        for handle in self._registration_hooks:
            handle.remove()
        self.device_state.release()
        self.device_state = self._new_device_state()
        if self._holds_compilation_cache:
            self._holds_compilation_cache = False
            jax_backend.compilation_cache.release()
        jax_backend.step_pool.release()  # cpu_step_memory="pool": its kept blocks, its hooks

    def hold_compilation_cache(self) -> str | None:
        """Turns the persistent compilation cache on while this backend lives (``Backend``
        calls it once the backend is built; ``shutdown`` gives it back): see
        jax_backend/compilation_cache.py. Returns its directory (None: off)."""
        if self._holds_compilation_cache:
            return jax_backend.compilation_cache.enabled_directory()
        self._holds_compilation_cache = True
        return jax_backend.compilation_cache.acquire()


class BackendHook:
    """A hook the backend puts on a registered model or optimizer (``method`` of the
    backend). It holds the backend weakly, and a copy or pickle of the model gets a hook that
    does nothing: ``copy.deepcopy(model)`` is a plain model, not a registered one (the
    backend itself, with its devices, cannot be copied)."""

    def __init__(self, backend, method: str):
        self._backend = weakref.ref(backend)
        self._method = method

    def __call__(self, *args, **kwargs):
        backend = self._backend()
        if backend is not None:
            return getattr(backend, self._method)(*args, **kwargs)
        return None

    def __deepcopy__(self, memo):
        return _unregistered_hook

    def __reduce__(self):
        return _unregistered_hook_factory, ()


def _unregistered_hook(*args, **kwargs):
    """What a copied model has in place of a ``BackendHook``."""
    return None


def _unregistered_hook_factory():
    return _unregistered_hook
