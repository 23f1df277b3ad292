"""What every backend implementation owns: registered stateful objects, their device state,
the step-closure queue and the data-executor hooks.

State lives on the JAX side between steps (``jax_backend.DeviceState``). The torch objects
(parameters, optimizer state, ...) are brought up to date only when someone asks:
``state_dict()`` of a compiled model or optimizer, a checkpoint closure, any torch access to
a state tensor, or ``materialize_state()``; the end of a data executor's run brings up to date
only the tensors that could be read without such an access (``on_run_end``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
import weakref
from typing import Callable

import torch
from torch.nn.modules import module as _torch_module

import jax_backend
from jax_backend import DeviceState, LazyTensor, Slot, materialize, shared_memory
from cstorch.backend import precision, run_hooks
from cstorch.distributed import runtime
from cstorch.storage.deferred import DeferredTensor
from cstorch.utils.stage_tracker import StageTracker


@dataclasses.dataclass
class QueuedClosure:
    kind: str  # "step" or "checkpoint"
    fn: Callable
    args: tuple
    kwargs: dict


def warn_cluster_config_ignored(backend_name: str, cluster_config) -> None:
    """Scripts written for CSX (e.g. gigaGPT) pass ``cluster_config`` to every backend; off
    CSX it has no meaning. cerebras-pytorch 2.10 raises TypeError; we accept it and say so."""
    if cluster_config is None:
        return
    from cstorch.distributed.cluster_config import ClusterConfig

    if not isinstance(cluster_config, ClusterConfig):
        raise TypeError(f"cluster_config must be a cstorch.distributed.ClusterConfig, got "
                        f"{type(cluster_config).__name__}.")
    warnings.warn(f"The {backend_name} backend ignores cluster_config (it only configures "
                  "CSX runs).", UserWarning, stacklevel=6)  # the cstorch.backend(...) call


class BaseBackend:
    engine = "jax"  # how traced steps run (cstorch.core.engine); the CPU backend can be eager

    def __init__(self, backend_type, device, artifact_dir, jax_devices, layout=None):
        self.backend_type = backend_type
        self.device = device
        self.artifact_dir = artifact_dir
        self.jax_devices = list(jax_devices)
        self.layout = layout  # jax_backend.mesh.Layout of a multi-device (CSX) run, else None
        self.models: list = []
        self.optimizer_registry: list = []
        self.schedulers: list = []
        self.grad_scalers: list = []
        self.metrics: list = []
        self.stateful_objects: list = []  # anything else exposing _cstorch_state_slots()
        self.sparsity_registry: list = []  # cstorch.sparse algorithms, in creation order
        self.device_state = self._new_device_state()
        self._holds_compilation_cache = False
        self.appliance_tracker = StageTracker()  # written as each executor's track.json
        self.appliance_tracker.start("Initialization")
        self.step_closures: list[QueuedClosure] = []
        # zero_grad calls of any optimizer or compiled module: a traced step that computes
        # gradients without zeroing them is told apart from one zeroed between its calls.
        self.gradient_resets = 0
        self.compilations = 0  # programs compiled (progress says whether a run's first step did)
        # ids of the parameters whose .grad eager torch would hold (a tensor, not None)
        # between steps: a compiled step's gradients are not kept, but a parameter that has
        # one starts the next step with a zero gradient, so that a parameter frozen after
        # zero_grad(set_to_none=False) is still stepped (momentum, weight decay), as in eager.
        self.gradients_held: frozenset = frozenset()
        self.data_executor_stack: list = []
        self._steps_running = 0  # traced steps being called (their closures wait for the end)
        self.last_step_outputs = None  # of the executor's current step: its progress's loss
        self._recorder = None  # closures recorded while tracing
        self._at_trace_exit: list = []  # callbacks that drop trace-time Python values
        self._models_in_trace = None
        self._next_model_id = 0
        self._state_epoch = 0  # bumped whenever the set of state tensors may have changed
        self._state_view = None
        self._registration_hooks = [
            torch.nn.modules.module.register_module_parameter_registration_hook(
                self._invalidate_state_view),
            torch.nn.modules.module.register_module_buffer_registration_hook(
                self._invalidate_state_view),
        ]

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

    @property
    def is_tracing(self) -> bool:
        return self._recorder is not None

    @property
    def data_executor(self):
        if not self.data_executor_stack:
            raise RuntimeError(
                "Detected that a data executor was not used. Iterate over a "
                "cstorch.utils.data.DataExecutor to run steps.")
        return self.data_executor_stack[-1]

    @property
    def run_context(self):
        return self.data_executor.run_context if self.data_executor_stack else None

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

        view = self._state_view
        path = view.path_of(tensor) if view is not None else None
        return state_name(path) if path is not None else None

    def setup_model(self, model: torch.nn.Module) -> int:
        # What can be seen of its memory now: a storage that is resizable here has no numpy
        # array behind it, whatever exports it later (jax_backend.shared_memory).
        shared_memory.note_resizable([*model.parameters(), *model.buffers()])
        if model not in self.models:
            self.models.append(model)
            for module in model.modules():
                module.register_state_dict_pre_hook(BackendHook(self, "_state_dict_pre_hook"))
            model.register_load_state_dict_post_hook(
                BackendHook(self, "_invalidate_state_view"))
            self._invalidate_state_view()
            run_hooks.model_registered(model)
        try:  # as the reference: compiled models know their device
            model.device = self.torch_device
        except AttributeError:
            pass  # a read-only `device` property of its own (HF models): it already tells
        model_id = self._next_model_id
        self._next_model_id += 1
        return model_id

    @property
    def mode(self) -> str:
        """"eval" once every registered model is in eval mode, else "train"."""
        if self.models and not any(model.training for model in self.models):
            return "eval"
        return "train"

    def module_modes(self) -> tuple:
        """The ``training`` flag of every module of every registered model. A step traced in
        one combination of modes (dropout on, batch-norm statistics updated, ...) is only
        valid in that combination, so this is part of what selects a compiled program."""
        return tuple(tuple(module.training for module in model.modules())
                     for model in self.models)

    def module_modes_and_hooks(self) -> tuple:
        """``(modes, hooks)`` in one walk over the modules: the ``training`` flag of each (as
        ``module_modes``, in another order) and ``hooks``, which names every
        forward and backward hook of every registered module, and torch's global module
        hooks, by handle id (ids are never reused): a hook registered or removed between
        steps changes what eager torch computes, so it selects another program. Each entry
        is positions (atoms) then tuples of handle ids (``programs.persistent_signature``
        ranks the ids)."""
        modes, hooks = [], []
        for m, model in enumerate(self.models):
            flags = []
            # Depth first over ``_modules`` (a shared submodule is visited once per place it
            # is used): cheaper than ``modules()``, which builds every name.
            stack = [model]
            while stack:
                module = stack.pop()
                flags.append(module.training)
                if (module._forward_hooks or module._forward_pre_hooks
                        or module._backward_hooks or module._backward_pre_hooks):
                    hooks.append((m, len(flags), tuple(module._forward_pre_hooks),
                                  tuple(module._forward_hooks),
                                  tuple(module._backward_pre_hooks),
                                  tuple(module._backward_hooks)))
                children = module._modules
                if children:
                    stack.extend(child for child in children.values() if child is not None)
            modes.append(tuple(flags))
        hooks.extend(("torch global", k, tuple(table))
                     for k, table in enumerate(_global_module_hooks()) if table)
        return tuple(modes), tuple(hooks)

    def parameter_autograd(self, view: "StateView") -> tuple:
        """``(requires_grad of each model parameter, hooks on them, whether it is frozen and
        holds a gradient)``: freezing a layer, registering a tensor hook or setting a frozen
        layer's gradients to None between steps changes what eager torch computes, so it
        selects another program. (Whether a trainable parameter starts with a zero gradient
        or none changes nothing: backward gives it one.) Read without the state guard (no
        value is touched)."""
        hooks = []
        held = self.gradients_held
        with torch._C.DisableTorchFunctionSubclass():
            flags = tuple(p.requires_grad for p in view.parameters)
            holding = tuple(not p.requires_grad and (id(p) in held or p.grad is not None)
                            for p in view.parameters)
            for i, p in enumerate(view.parameters):
                before, after = p._backward_hooks, p._post_accumulate_grad_hooks
                if before or after:
                    hooks.append((i, tuple(before or ()), tuple(after or ())))
        return flags, tuple(hooks), holding

    def gradients_reset(self, parameters, set_to_none: bool) -> None:
        """A ``zero_grad`` of an optimizer or compiled module over ``parameters``: counted
        (``GradientAccumulationWarning``); between steps with ``set_to_none``, those
        parameters hold no gradient any more (``gradients_held``)."""
        self.gradient_resets += 1
        if set_to_none and not self.is_tracing and self.gradients_held:
            self.gradients_held = self.gradients_held - {id(p) for p in parameters}

    def _state_dict_pre_hook(self, module, prefix, keep_vars):
        self.materialize_state()

    def register_optimizer(self, optimizer) -> None:
        shared_memory.note_resizable(
            [v for state in optimizer.state.values() for v in state.values()]
            + [v for group in optimizer.param_groups for v in group.values()])
        self.optimizer_registry.append(optimizer)
        # load_state_dict replaces the optimizer's state dicts wholesale.
        optimizer.register_load_state_dict_post_hook(
            BackendHook(self, "_invalidate_state_view"))
        self._invalidate_state_view()

    def setup_scheduler(self, scheduler) -> None:
        self._invalidate_state_view()
        if scheduler not in self.schedulers:
            self.schedulers.append(scheduler)
        scheduler.optimizer._schedulers_registry[scheduler] = None
        if not isinstance(scheduler.last_epoch, torch.Tensor):
            scheduler.last_epoch = torch.tensor(scheduler.last_epoch, dtype=torch.int64)
        shared_memory.note_resizable([scheduler.last_epoch])

    def setup_grad_scaler(self, scaler) -> None:
        self.grad_scalers.append(scaler)
        self._invalidate_state_view()

    def register_metric(self, metric) -> None:
        self.metrics.append(metric)
        self._invalidate_state_view()

    def register_stateful(self, obj) -> None:
        self.stateful_objects.append(obj)
        self._invalidate_state_view()

    def setup_sparsity(self, sparsity) -> None:
        """Registers a ``cstorch.sparse`` algorithm: its state is carried between steps and
        its masks are initialised before the first step (run start, or the capture of a
        traced step, which calls ``initialize_sparsity``)."""
        self.sparsity_registry.append(sparsity)
        self.register_stateful(sparsity)

    def initialize_sparsity(self) -> None:
        """Initialises every sparsity mask not yet initialised or loaded."""
        for sparsity in self.sparsity_registry:
            sparsity.initialize()

    # ------------------------------------------------------------------ state
    def state_slots(self) -> list[tuple[tuple, Slot]]:
        """Every place holding a tensor that outlives a step, as ``(path, slot)`` pairs.

        A path names the place independently of the tensor in it and of other registered
        objects (registries only grow), so a compiled step can find its state again after
        new models, optimizers or metrics were registered."""
        entries = []
        for m, model in enumerate(self.models):
            for name, module in model.named_modules():
                entries += [(("model", m, name, "param", n), Slot(module._parameters, n))
                            for n, p in module._parameters.items() if p is not None]
                entries += [(("model", m, name, "buffer", n), Slot(module._buffers, n))
                            for n, b in module._buffers.items() if b is not None]
        for o, optimizer in enumerate(self.optimizer_registry):
            position = {}
            for g, group in enumerate(optimizer.param_groups):
                entries += [(("optimizer", o, "group", g, k), Slot(group, k))
                            for k, v in group.items()
                            if k != "params" and isinstance(v, torch.Tensor)]
                for p in group["params"]:
                    position.setdefault(id(p), len(position))
            for param, state in optimizer.state.items():
                where = position.get(id(param), ("unlisted", id(param)))
                entries += [(("optimizer", o, "state", where, k), Slot(state, k))
                            for k, v in state.items() if isinstance(v, torch.Tensor)]
        for kind, objects in (("scheduler", self.schedulers), ("scaler", self.grad_scalers),
                              ("metric", self.metrics), ("stateful", self.stateful_objects)):
            for i, obj in enumerate(objects):
                entries += [((kind, i, slot.key), slot) for slot in obj._cstorch_state_slots()]
        # Named as everywhere else (``cstorch.core.state_names``), so capture errors say which
        # state they are about in the spelling of recompile reasons and the export manifest.
        from cstorch.core.state_names import state_name  # cstorch.core imports this module

        return [(path, dataclasses.replace(slot, name=state_name(path))) for path, slot in entries]

    def _invalidate_state_view(self, *args, **kwargs):
        self._state_epoch += 1

    def state_view(self) -> "StateView":
        """The current state slots and unique state tensors, recollected only when needed.

        The cached view stays valid while no stateful object was registered or loaded (the
        epoch) and every slot still holds the tensor it held (catches rebinding)."""
        view = self._state_view
        groups = self._param_group_sizes()
        if view is None or view.epoch != self._state_epoch or view.group_sizes != groups \
                or not view.still_holds():
            self._state_view = None  # it holds the old tensors: retain may let them go
            entries = self.state_slots()
            _read_deferred_state(entries)
            view = StateView(self._state_epoch, entries)
            view.optimizer_params = self._optimizer_links(view)
            view.group_sizes = groups
            shared_memory.note_resizable(view.tensors)
            self.device_state.retain(view.tensors)
            self._state_view = view
        return view

    def _param_group_sizes(self) -> tuple:
        """How many parameters each param group of each optimizer has: ``add_param_group``
        (which no hook reports) changes the state a step updates."""
        return tuple(tuple(len(group["params"]) for group in optimizer.param_groups)
                     for optimizer in self.optimizer_registry)

    def _optimizer_links(self, view) -> tuple:
        """Per optimizer, per group: the state path of each parameter it updates (None for
        one that is not state). A program captured the optimizer updating those tensors;
        replacing a model's parameter (the optimizer keeps the old one, as in eager torch)
        changes this and so needs another program."""
        path_of = dict(zip(map(id, view.tensors), view.paths))
        return tuple(tuple(tuple(path_of.get(id(p)) for p in group["params"])
                           for group in optimizer.param_groups)
                     for optimizer in self.optimizer_registry)

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
    @contextlib.contextmanager
    def tracing(self, recorder: list):
        """While a step body runs under the tracer: closures are recorded, only one model may
        be used, and Python values holding traced tensors are dropped on the way out, also
        when the trace fails (grad scalers', and those of ``at_trace_exit`` callbacks)."""
        if self._recorder is not None:
            raise RuntimeError("A traced step cannot trace another step inside it.")
        self._recorder = recorder
        self._models_in_trace = []
        try:
            yield
        finally:
            self._recorder = None
            self._models_in_trace = None
            for scaler in self.grad_scalers:
                scaler._forget_traced_values()
            callbacks, self._at_trace_exit = self._at_trace_exit, []
            for callback in callbacks:
                callback()

    def at_trace_exit(self, callback: Callable[[], None]) -> None:
        """Calls ``callback()`` when the step body being traced returns or raises."""
        if self._recorder is None:
            raise RuntimeError("at_trace_exit is only available while a step is traced.")
        self._at_trace_exit.append(callback)

    def forward(self, model, *args, **kwargs):
        if self._models_in_trace is not None:
            if self._models_in_trace and self._models_in_trace[0] is not model:
                raise RuntimeError(
                    "Detected that more than one compiled model was used in a step function. "
                    "Only one compiled model may be used per traced step; combine the models "
                    "into one torch.nn.Module and compile that.")
            if not self._models_in_trace:
                self._models_in_trace.append(model)
        return model(*args, **kwargs)

    # ------------------------------------------------------------------ closures
    @contextlib.contextmanager
    def running_step(self):
        """While a traced step is called: the closures it calls are queued, to run after it
        (by its DataExecutor, or by ``run_closures_of_a_step_outside_executor``)."""
        self._steps_running += 1
        try:
            yield
        finally:
            self._steps_running -= 1

    def add_step_closure(self, kind: str, fn, args, kwargs) -> None:
        if self._recorder is not None:
            self._recorder.append(QueuedClosure(kind, fn, args, kwargs))
            return
        if not self.data_executor_stack and not self._steps_running:
            # Called from the user's loop with no DataExecutor to run it later: run it now,
            # after the values of the steps before it are ready (2.10 queues it until an
            # executor starts, i.e. often never: a deliberate difference).
            self._run_closures([QueuedClosure(kind, fn, args, kwargs)], scheduled=False)
            return
        args = torch.utils._pytree.tree_map(self._snapshot, args)
        kwargs = torch.utils._pytree.tree_map(self._snapshot, kwargs)
        self.step_closures.append(QueuedClosure(kind, fn, args, kwargs))

    def _snapshot(self, value):
        """A closure argument's value at call time (the device value for stale state)."""
        if not isinstance(value, torch.Tensor) or isinstance(value, LazyTensor):
            return value
        if self.device_state.is_stale(value):
            return LazyTensor(self.device_state.snapshot(value))
        return value.detach().clone()

    def run_step_closures(self) -> None:
        """Runs the queued closures, on process 0 only in a multi-process job (as on a
        cluster's user node). Every process fetches their arguments and, for checkpoint
        closures, the state first: gathering values split across processes is a collective."""
        queued, self.step_closures = self.step_closures, []
        self._run_closures(queued)

    def run_closures_of_a_step_outside_executor(self, first: int) -> None:
        """A traced step called outside a DataExecutor: the closures it queued (from index
        ``first`` of the queue) run now, with its values, so that what the step prints appears
        after the step, as in eager torch. cerebras-pytorch 2.10 keeps them queued until a
        DataExecutor starts, i.e. often never (a deliberate difference). A checkpoint closure
        has no checkpoint schedule outside an executor: it raises, as 2.10 does when such a
        closure is finally run. (Closures called outside any step and executor run when
        they are called, see ``add_step_closure``: none wait from before the step.)"""
        if not self.data_executor_stack:
            run_hooks.step_ended()  # (in an executor: at the end of its batch)
        if self.data_executor_stack or len(self.step_closures) <= first:
            return
        queued = self.step_closures[first:]
        del self.step_closures[first:]
        self._run_closures(queued)

    def _run_closures(self, queued: list, scheduled: bool = True) -> None:
        """Runs ``queued``. A checkpoint closure runs on the executor's checkpoint steps when
        ``scheduled``; unscheduled (called from the user's loop outside any executor), it
        runs now."""
        runs_here = runtime.process_index() == 0
        for closure in queued:
            if closure.kind == "checkpoint" and not scheduled:
                self.materialize_state()
            elif closure.kind == "checkpoint":
                context = self.run_context
                if context is None:
                    name = getattr(closure.fn, "__name__", "the checkpoint closure")
                    raise RuntimeError(
                        f"Cannot fetch a checkpoint outside of an execution context: "
                        f"checkpoint closure {name!r} was called from a step that runs "
                        "outside a cstorch DataExecutor, so there are no checkpoint steps to "
                        "run it on. Loop over cstorch.utils.data.DataExecutor(loader, "
                        "num_steps=..., checkpoint_steps=...) and call the step inside the "
                        "loop, or save directly with cstorch.save(model.state_dict(), path).")
                if not (context.is_pre_initial_step or context.is_checkpoint_step):
                    continue
                self.materialize_state()
            args = self.fetch_closure_values(closure.args)
            kwargs = self.fetch_closure_values(closure.kwargs)
            if runs_here:
                closure.fn(*args, **kwargs)

    def fetch_closure_values(self, values):
        """Step-closure arguments with their device values brought to the host."""
        return materialize(values)

    # ------------------------------------------------------------------ executor hooks
    def on_run_start(self) -> None:
        self.initialize_sparsity()
        self.run_step_closures()

    def on_run_end(self) -> None:
        """Brings up to date only the torch tensors something could read without asking the
        device state first: released ones (the large parameters and optimizer state that
        nothing else holds) are filled by their guard on first access, so copying them here
        would move every byte of the model to the host at each run's end for nothing."""
        state = self.device_state
        if state.has_pending:
            state.materialize([t for t in self.state_view().tensors
                               if not state.is_released(t)])

    def on_batch_start(self, batch):
        return batch

    def on_batch_end(self) -> None:
        self.run_step_closures()

    def name_scope(self, name: str):
        return contextlib.nullcontext()

    def shutdown(self) -> None:
        """Releases device state and global hooks (used when a test tears the backend down)."""
        self.step_closures = []
        for handle in self._registration_hooks:
            handle.remove()
        self.device_state.release()
        self.device_state = self._new_device_state()
        if self._holds_compilation_cache:
            self._holds_compilation_cache = False
            jax_backend.compilation_cache.release()

    def hold_compilation_cache(self) -> str | None:
        """Turns the persistent compilation cache on while this backend lives (``Backend``
        calls it once the backend is built; ``shutdown`` gives it back): see
        jax_backend/compilation_cache.py. Returns its directory (None: off)."""
        if self._holds_compilation_cache:
            return jax_backend.compilation_cache.enabled_directory()
        self._holds_compilation_cache = True
        return jax_backend.compilation_cache.acquire()


def _read_deferred_state(entries) -> None:
    """Reads each deferred tensor (``cstorch.load``'s, read from the file on use) that became
    state into a tensor of its own, in its slot. torch's ``load_state_dict`` keeps the loaded
    tensors themselves, and ``clone()`` of an unmodified deferred tensor is deferred too; the
    state guard cannot watch one, so every step would write its state through to it. The
    reference's CSX backend likewise moves loaded state to its device."""
    for _, slot in entries:
        value = slot.get()
        if isinstance(value, DeferredTensor):  # copy_ reads it (torch dispatch)
            slot.set(torch.empty(value.shape, dtype=value.dtype).copy_(value))


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


class StateView:
    """A snapshot of where the state lives: slots with their paths, and the unique tensors
    they hold (each named by the path of its first slot)."""

    def __init__(self, epoch: int, entries: list):
        self.epoch = epoch
        self.slots = [slot for _, slot in entries]
        self.held = [slot.get() for slot in self.slots]
        seen, tensors, paths = set(), [], []
        for (path, _), tensor in zip(entries, self.held):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                tensors.append(tensor)
                paths.append(path)
        self.tensors = tensors
        self.paths = paths
        self.index_of = {path: i for i, path in enumerate(paths)}
        # model parameters (unique), whose requires_grad and hooks select a program
        self.parameters = [t for path, t in zip(paths, tensors)
                           if path[0] == "model" and path[3] == "param"]
        # every slot's path -> the path naming its tensor (tied weights share one)
        first = dict(zip(map(id, tensors), paths))
        self.named_by = {path: first[id(tensor)] for (path, _), tensor in zip(entries, self.held)}
        self.optimizer_params: tuple = ()  # set by the backend (optimizer_links)
        self.group_sizes: tuple = ()  # set by the backend (_param_group_sizes)

    def path_of(self, tensor):
        """The path naming ``tensor`` (its first slot), or None if it is not state here."""
        for path, held in zip(self.paths, self.tensors):
            if held is tensor:
                return path
        return None

    def aval(self, index: int) -> tuple:
        tensor = self.tensors[index]
        return tuple(tensor.shape), tensor.dtype

    def still_holds(self) -> bool:
        return all(slot.container.get(slot.key) is tensor
                   for slot, tensor in zip(self.slots, self.held))



def _global_module_hooks() -> tuple:
    """torch's hook tables that apply to every module (``register_module_forward_hook``
    and its relatives)."""
    return tuple(getattr(_torch_module, name, None) or {} for name in (
        "_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
        "_global_backward_hooks"))
