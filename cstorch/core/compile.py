"""``cstorch.compile`` and ``@cstorch.trace``.

``trace`` turns a training or eval step into a compiled program: the first call captures the
whole step (forward, backward, optimizer, scheduler) as one graph and jits it; every later
call with the same input signature is a single call of that program. The step body does not
run again, as on a Cerebras system. A new signature (shapes, dtypes, structure, train/eval
mode) compiles a new program, with a warning; the CSX backend refuses (the wafer cannot
recompile).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import inspect
import warnings
from typing import Callable, NamedTuple

import torch
from torch.utils import _pytree as pytree
from torch.utils.hooks import RemovableHandle

import jax_backend
from jax_backend import LazyTensor, Program, capture_step
from jax_backend.dtypes import tensor_to_host
from jax_backend.jax_settings import in_engine_scope
from jax_backend.user_frames import warn
from cstorch import config
from cstorch.backend import (
    Backend, BackendType, backend as _backend_fn, current_backend_impl, implicit_cpu_backend)
from cstorch.core import born_state, torch_optimizers
from cstorch.core.capture_cache import CaptureCache
from cstorch.errors import MultipleBackendsError
from cstorch.core.state_names import state_name
from cstorch.core.engine import run_eagerly
from cstorch.decomp.registry import decompositions_for
from cstorch.experimental import listener

# User hooks run around every capture. OrderedDicts: RemovableHandle keeps a weak reference
# to its dict (a plain dict has none).
_trace_pre_hooks: dict = collections.OrderedDict()
_trace_post_hooks: dict = collections.OrderedDict()


#: How many compiled programs one traced step keeps (``cstorch.config``: max_programs).
MAX_PROGRAMS = config.max_programs


class RecompilationWarning(UserWarning):
    """A traced step was compiled again for a new input signature."""


class FrozenValueWarning(UserWarning):
    """A Python (non-tensor) argument of a traced step changed after compilation."""


class GradientAccumulationWarning(UserWarning):
    """A traced step computes gradients that nothing zeroes: eager torch would accumulate
    them across steps, a compiled step starts every step from zero gradients."""


def register_trace_fn_pre_hook(hook) -> RemovableHandle:
    """Calls ``hook()`` before every capture of a traced step."""
    handle = RemovableHandle(_trace_pre_hooks)
    _trace_pre_hooks[handle.id] = hook
    return handle


def register_trace_fn_post_hook(hook) -> RemovableHandle:
    """Calls ``hook()`` after every capture of a traced step, also one that failed."""
    handle = RemovableHandle(_trace_post_hooks)
    _trace_post_hooks[handle.id] = hook
    return handle


@contextlib.contextmanager
def _capture_scope():
    """Everything that holds only while a step is captured, set up and torn down in one
    place: the user's pre/post hooks and the traced-tensor listener. The exit always runs,
    so a failed trace leaves nothing half-applied. (Per-body state, such as recorded closures
    and the metrics' and grad scalers' traced values, is scoped by ``impl.tracing``.)"""
    for hook in list(_trace_pre_hooks.values()):
        hook()
    try:
        with listener.listening():
            yield
    finally:
        for hook in list(_trace_post_hooks.values()):
            hook()


# ---------------------------------------------------------------------------------- compile
def compile(model: torch.nn.Module, backend=None):  # the public name
    """Registers ``model`` with the backend and returns a function that runs it.

    The result is a plain function (not a Module) carrying the model's public bound methods
    (``compiled.train``, ``compiled.parameters``, ...) and ``compiled.device``.
    """
    if backend is None:
        impl = current_backend_impl(raise_exception=False)
        if impl is None:  # adopted by the first explicit cstorch.backend("CPU")
            impl = implicit_cpu_backend()._impl
    elif isinstance(backend, (str, BackendType)):
        if current_backend_impl(raise_exception=False) is not None:
            # a second backend, as in 2.10 (only an explicit cstorch.backend adopts one
            # that compile made)
            raise MultipleBackendsError(
                f"Cannot instantiate multiple backends: cstorch.compile(model, {backend!r}) "
                f"asks for a new backend, but one already exists. Pass it instead: "
                f"cstorch.compile(model, cstorch.backend()), or nothing.")
        impl = _backend_fn(backend)._impl
    elif isinstance(backend, Backend):
        current = current_backend_impl(raise_exception=False)
        if backend._impl is not current:
            raise RuntimeError(
                "Compile got a different backend than the current backend. Pass the backend "
                "returned by cstorch.backend() (or nothing) to cstorch.compile.")
        impl = backend._impl
    else:
        raise TypeError(
            f"Expected backend to be a backend type string, a BackendType or a Backend, "
            f"got {type(backend).__name__}.")

    device = getattr(model, "cerebras_device", None)
    if device is not None and str(device) != str(impl.device):
        raise RuntimeError(
            f"The model was created for device {device} but the backend's device is "
            f"{impl.device}. Create the model under the current backend's device.")
    _refuse_uninitialized_lazy_modules(model)
    impl.setup_model(model)
    for module in model.modules():
        module.apply = _ModuleMethod(_apply, module)
        module.zero_grad = _ModuleMethod(_zero_grad, module)

    def compiled(*args, **kwargs):
        return impl.forward(model, *args, **kwargs)

    for name in dir(model):
        if name.startswith("_"):
            continue
        attr = getattr(model, name, None)
        if callable(attr) and getattr(attr, "__self__", None) is model:
            setattr(compiled, name, attr)
    compiled.device = impl.torch_device
    return compiled


def _refuse_uninitialized_lazy_modules(model: torch.nn.Module) -> None:
    """A lazy module (``nn.LazyLinear``, ...) creates its parameters in its first forward
    pass; a compiled step cannot create parameters (``born_state``)."""
    lazy = [f"{name or 'the model'} ({type(module).__name__})"
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.modules.lazy.LazyModuleMixin)
            and module.has_uninitialized_params()]
    if lazy:
        raise ValueError(
            f"cstorch.compile got a model with uninitialized lazy modules: {', '.join(lazy)}. "
            "Their parameters are created by the first forward pass, which a compiled step "
            "cannot do. Run one forward pass eagerly before compiling "
            "(`model(example_batch)`, as torch asks before building an optimizer), or give "
            "the layer its input size (e.g. `nn.Linear(in_features, out_features)`).")


class _ModuleMethod:
    """A function bound to one compiled module as an instance attribute (``apply``,
    ``zero_grad``). Unlike a bound method, a copy or pickle of the module gets the same
    function bound to the copy (a pickled bound method comes back as whatever
    ``getattr(module, name)`` finds, e.g. torch's ``Module._apply``, which does something
    else)."""

    def __init__(self, function, module: torch.nn.Module):
        self.__func__ = function
        self.__self__ = module

    def __call__(self, *args, **kwargs):
        return self.__func__(self.__self__, *args, **kwargs)

    def __reduce__(self):
        return _ModuleMethod, (self.__func__, self.__self__)


def _apply(module: torch.nn.Module, fn):
    """``Module.apply`` that also accepts objects with an ``apply(module)`` method (sparsity,
    ``SelectiveGrad``, compression), as compiled modules do in cerebras-pytorch.

    Bound to each compiled module as an instance attribute (the reference does the same); it
    calls ``torch.nn.Module.apply`` itself rather than keeping a closure over each module's
    previous ``apply``, so compiling a model twice does not stack wrappers."""
    if callable(fn):
        return torch.nn.Module.apply(module, fn)
    if hasattr(fn, "apply"):
        return fn.apply(module)
    raise TypeError(
        f"Expected a callable as the argument to apply, got {type(fn).__name__}. Pass a "
        "function of one module, or an object with an `apply(module)` method.")


def _zero_grad(module: torch.nn.Module, set_to_none: bool = True) -> None:
    """``Module.zero_grad`` that the backend counts (see ``GradientAccumulationWarning``)."""
    impl = current_backend_impl(raise_exception=False)
    if impl is not None:
        impl.gradient_resets += 1
    torch.nn.Module.zero_grad(module, set_to_none)


# ------------------------------------------------------------------------------------ trace
def _step_counts(impl) -> list:
    """(object, _step_count) of every optimizer and scheduler of the backend."""
    return [(obj, obj._step_count) for obj in [*impl.optimizer_registry, *impl.schedulers]
            if isinstance(getattr(obj, "_step_count", None), int)]


def _undo_counting(before: list, passes: int) -> list:
    """Python counters (``_step_count``) go up while the step body is traced, possibly more
    than once. Put them back and return what one step adds to each, so every run of the
    compiled program can add it, as every call of an eager step would."""
    steps = []
    for obj, count in before:
        added = obj._step_count - count
        obj._step_count = count
        if added and passes:
            steps.append((obj, added // passes))
    return steps


@dataclasses.dataclass
class _CompiledStep:
    captured: jax_backend.CapturedStep
    program: Program
    closures: list  # (kind, fn) per closure recorded during the trace
    python_leaves: tuple  # the non-tensor arguments the graph was traced with
    used_paths: list  # state paths of the program's state inputs
    written_paths: list  # state paths of the program's state outputs
    state_avals: dict  # path -> (shape, dtype) the program was compiled for
    hyperparameters: list  # per optimizer that existed at compile time: its group values
    counter_steps: list  # (optimizer or scheduler, how much one step adds to its _step_count)
    optimizer_params: tuple  # per optimizer at compile time: the state paths it updates
    ties: dict  # slot path -> path of its tensor, for the slots of this program's state
    cache: CaptureCache | None = None  # until the first good run: where the graph goes/came
    leaves_gradients: bool = False  # computes gradients and does not zero them
    # State born in the step (``born_state``): this program runs once, at the first call,
    # and its last outputs are the born tensors' values; ``steady`` serves later calls.
    born: list = dataclasses.field(default_factory=list)
    steady: "_CompiledStep | None" = None
    born_before: dict | None = None  # born_state.snapshot before the capture (to undo it)
    _resolved: tuple = (None, None, None)  # (view, used indices, written indices)
    _mismatch: tuple = (None, None)  # (view, why this program does not fit it)

    def matches_hyperparameters(self, current: list) -> bool:
        """Python-number hyperparameters are constants of the graph: a program only serves
        optimizers whose param groups hold the values (or tensor-ness) it was traced with."""
        return current[:len(self.hyperparameters)] == self.hyperparameters

    def resolve(self, view):
        """Positions of this program's state in ``view``; None if the state it was compiled
        for does not fit the view any more (``mismatch``). Cached per view."""
        if self._resolved[0] is view:
            return self._resolved[1:]
        if self.mismatch(view) is not None:
            return None
        used = [view.index_of[p] for p in self.used_paths]
        written = [view.index_of[p] for p in self.written_paths]
        self._resolved = (view, used, written)
        return used, written

    def mismatch(self, view) -> str | None:
        """Why this program cannot run on the state of ``view``, or None if it can: state it
        uses is gone, changed shape or dtype, is no longer the tensor its optimizer updates
        (a parameter replaced), or is tied differently."""
        if self._mismatch[0] is view:
            return self._mismatch[1]
        reason = self._find_mismatch(view)
        self._mismatch = (view, reason)
        return reason

    def _find_mismatch(self, view) -> str | None:
        for path in self.used_paths + self.written_paths:
            index = view.index_of.get(path)
            if index is None:
                return f"state {state_name(path)} is gone or now shares a tensor"
            if view.aval(index) != self.state_avals[path]:
                return f"state {state_name(path)} changed shape or dtype"
        current = view.optimizer_params[:len(self.optimizer_params)]
        for o, (then, now) in enumerate(zip(self.optimizer_params, current)):
            if then != now:
                return (f"the parameters optimizer {o} updates are no longer the model's "
                        "(a parameter was replaced: the optimizer keeps the old tensor, as "
                        "in eager torch)" if len(then) == len(now) else
                        f"optimizer {o} has another number of param groups")
        for slot, named in self.ties.items():
            if view.named_by.get(slot) != named:
                return (f"state {state_name(slot)} was replaced or tied/untied "
                        "differently")
        return None


def _frozen(value):
    """A comparable stand-in for a param-group value (tensors only count as "a tensor")."""
    if isinstance(value, torch.Tensor):
        return "<tensor>"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(_frozen(v) for v in value)
    return repr(value)  # e.g. numpy arrays, whose == is elementwise


def _hyperparameters(impl) -> list:
    """The param-group values (tensors marked as such) of every registered optimizer."""
    return [tuple(tuple((k, _frozen(v)) for k, v in group.items() if k != "params")
                  for group in optimizer.param_groups)
            for optimizer in impl.optimizer_registry]


class ProgramSignature(NamedTuple):
    """What selects a program, besides the state it uses (checked by ``resolve``)."""

    input_structure: pytree.TreeSpec
    input_shapes_dtypes: tuple  # (shape, dtype) per tensor leaf, None for other leaves
    train_eval_modes: tuple  # ``training`` of every module of every registered model
    grad_mode: bool
    precision_policy: jax_backend.Policy
    requires_grad: tuple  # of every model parameter
    parameter_hooks: tuple  # register_hook / post-accumulate hooks on parameters, by handle
    module_hooks: tuple  # forward/backward hooks of modules and torch's global ones


_FIELD_NAMES = {"input_shapes_dtypes": "input shapes/dtypes",
                "train_eval_modes": "train/eval mode",
                "requires_grad": "requires_grad of a parameter (e.g. a layer frozen with "
                                 "requires_grad_(False))",
                "parameter_hooks": "hooks on parameters (register_hook)",
                "module_hooks": "module hooks (register_forward_hook and the like)"}


def _signature(leaves, spec, impl, view) -> ProgramSignature:
    tensors = tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else None
                    for x in leaves)
    modes, module_hooks = impl.module_modes_and_hooks()
    requires_grad, parameter_hooks = impl.parameter_autograd(view)
    return ProgramSignature(spec, tensors, modes, torch.is_grad_enabled(),
                            impl.precision_policy(), requires_grad, parameter_hooks,
                            module_hooks)


def _input_array(tensor):
    if isinstance(tensor, LazyTensor):
        return tensor.jax_array
    return tensor_to_host(tensor)


def _metadata_twin(tensor, layout=None):
    """A plain tensor with the same metadata, for tracing (lazy outputs fed back in). Across
    processes a batch input is traced with its global shape (see ``mesh.Layout``)."""
    if isinstance(tensor, LazyTensor):
        return torch.empty(tuple(tensor.shape), dtype=tensor.dtype)
    if layout is not None:
        shape = layout.global_input_shape(tensor.shape)
        if shape != tuple(tensor.shape):
            return torch.empty(shape, dtype=tensor.dtype)
    return tensor


class TracedStep:
    """A step function compiled into one program per input signature."""

    def __init__(self, step_fn: Callable):
        self.step_fn = step_fn
        self.trace_count = 0
        # signature -> [_CompiledStep], told apart by their state; least recently used first
        self._programs: collections.OrderedDict = collections.OrderedDict()
        self._warned_evicted = False
        self._last_key = None
        self._warned_frozen = False
        self._resets_after_call = None  # backend.gradient_resets after the previous call
        functools.update_wrapper(self, step_fn)

    @property
    def programs(self) -> list:
        return [entry.program for entries in self._programs.values() for entry in entries]

    def __set_name__(self, owner, name):
        self._attribute_name = name

    def __get__(self, obj, objtype=None):
        """``@cstorch.trace`` on a method: ``obj.step`` is a traced step bound to ``obj``.

        Each instance gets its own bound step (and so its own compiled programs), cached in
        the instance's ``__dict__`` like ``functools.cached_property`` does.
        """
        if obj is None:
            return self
        bound = TracedStep(self.step_fn.__get__(obj, objtype))
        name = getattr(self, "_attribute_name", None)
        if name is not None and hasattr(obj, "__dict__"):
            obj.__dict__[name] = bound
        return bound

    def __call__(self, *args, **kwargs):
        impl = current_backend_impl()
        if impl.is_tracing:  # a traced step called from inside another: inline it
            return self.step_fn(*args, **kwargs)
        queued_before = len(impl.step_closures)
        with impl.running_step():  # closures called in the step wait for its end
            if impl.engine == "eager":  # plain eager torch every step (cstorch.core.engine)
                outputs = run_eagerly(self.step_fn, impl, args, kwargs)
            else:
                outputs = self._call_compiled(impl, args, kwargs)
        # Outside a DataExecutor nothing else would run this step's closures.
        impl.run_closures_of_a_step_outside_executor(queued_before)
        if impl.data_executor_stack:  # the executor's progress display shows the loss
            impl.last_step_outputs = outputs
        return outputs

    def _program_for(self, impl, leaves, spec):
        """The compiled step for these arguments and the current state, compiled now if
        needed (without running it): ``(entry, key, view, positions)``. A torch optimizer
        the capture meets for the first time is adopted and the step captured again."""
        while True:
            try:
                return self._find_or_compile(impl, leaves, spec)
            except torch_optimizers.Unadopted as found:
                torch_optimizers.adopt(impl, found.optimizer)

    def _find_or_compile(self, impl, leaves, spec):
        view = impl.state_view()
        key = _signature(leaves, spec, impl, view)
        hyperparameters = _hyperparameters(impl)
        for entry in self._programs.get(key, ()):
            positions = entry.resolve(view)
            if positions is not None and entry.matches_hyperparameters(hyperparameters):
                self._check_frozen(entry, leaves)
                self._programs.move_to_end(key)
                break
        else:
            reasons = [entry.mismatch(view) for entry in self._programs.get(key, ())]
            entry = self._compile(impl, key, leaves, spec, view,
                                  reason=next((r for r in reasons if r), None))
            if entry.born:
                return self._with_born_state(impl, entry, leaves, spec)
            key = self._refile(entry, key, leaves, spec, impl, view)
            positions = entry.resolve(view)
            self._evict_unused()
        self._last_key = key
        return entry, key, view, positions

    def _with_born_state(self, impl, born_entry, leaves, spec):
        """A first capture in which state was born (``born_state``): its tensors get real
        slots, and the step is captured again for every later call; ``born_entry`` runs
        this once."""
        born_state.install(impl, born_entry.born)
        view = impl.state_view()
        key = _signature(leaves, spec, impl, view)
        try:
            steady = self._compile(impl, key, leaves, spec, view)
        except BaseException:
            born_state.discard(impl, born_entry.born_before)
            raise
        if steady.born:
            self._forget(steady)
            born_state.discard(impl, born_entry.born_before)
            raise jax_backend.CaptureError(
                f"{self.step_fn.__name__!r} creates new state ("
                f"{state_name(steady.born[0].paths[0])}) in its second step too: state born "
                "in a step is only supported in the first one (a lazily created optimizer "
                "state or buffer). Create it before the first step.")
        born_entry.steady = steady
        self._last_key = self._refile(steady, key, leaves, spec, impl, view)
        return born_entry, self._last_key, view, born_entry.resolve(view)

    def _forget(self, entry) -> None:
        for key, entries in list(self._programs.items()):
            if entry in entries:
                entries.remove(entry)
                if not entries:
                    del self._programs[key]

    def _call_compiled(self, impl, args, kwargs):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        entry, key, view, positions = self._program_for(impl, leaves, spec)
        self._check_gradients_are_zeroed(impl, entry)
        try:
            outputs = self._run(impl, entry, leaves, view, *positions)
        except Exception as error:  # re-raised unless a cached graph failed
            if entry.born:  # the state it would have given birth to is not there: undo it
                self._undo_first_step_program(impl, entry)
                raise
            if entry.cache is None or not entry.cache.hit or entry.program.has_run:
                raise
            entry = self._recapture(impl, key, leaves, spec, view, entry, error)
            key = self._last_key = self._refile(entry, key, leaves, spec, impl, view)
            outputs = self._run(impl, entry, leaves, view, *entry.resolve(view))
        if entry.cache is not None:  # the first good run: keep the graph for later runs
            entry.cache, cache = None, entry.cache
            cache.store()
        return outputs

    def _compile_without_running(self, impl, args, kwargs) -> None:
        """Captures and compiles the step for ``args`` as its first call would, without
        running the program (compile-only runs)."""
        entry = self._program_for(impl, *pytree.tree_flatten((args, kwargs)))[0]
        if entry.born:  # the first run would give the born state its values: not run here
            self._undo_first_step_program(impl, entry)

    def _undo_first_step_program(self, impl, entry) -> None:
        """Forgets a program that creates state in the first step, not run (compile-only,
        export): the slots it would have filled are taken out, and the next call compiles
        both programs again."""
        born_state.discard(impl, entry.born_before)
        self._forget(entry.steady)

    def _refile(self, entry, key, leaves, spec, impl, view) -> ProgramSignature:
        """Files a just-captured program under the signature as the capture left it, and
        returns that. The step body may change what selects a program, e.g. register a
        gradient hook on a parameter in a forward hook (as sparsity does, again in every
        capture): the next call must find this program, not capture again."""
        after = _signature(leaves, spec, impl, view)
        if after != key:
            self._programs[key].remove(entry)
            if not self._programs[key]:
                del self._programs[key]
            self._programs.setdefault(after, []).append(entry)
        return after

    def _recapture(self, impl, key, leaves, spec, view, entry, error) -> _CompiledStep:
        """A graph from the cache whose program failed before it ever ran (state is left as
        it was): drop it and capture the step again (whose graph then replaces it)."""
        entry.cache.discard()
        self._programs[key].remove(entry)
        if not self._programs[key]:
            del self._programs[key]
        warn(f"The cached graph of {self.step_fn.__name__!r} failed ({type(error).__name__}: "
             f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}); it is "
             "captured again.", jax_backend.graph_cache.GraphCacheWarning)
        return self._compile(impl, key, leaves, spec, view, retry=True)

    # ---------------------------------------------------------------------------- compile
    def _compile(self, impl, key, leaves, spec, view, retry=False,
                 reason=None) -> _CompiledStep:
        if self._programs and not retry:
            changed = _describe_change(self._last_key, key, self.step_fn, reason)
            if impl.is_csx:
                raise jax_backend.RecompilationError(
                    f"The step function {self.step_fn.__name__!r} was called with a new "
                    f"signature ({changed}) after it was compiled. The CSX backend cannot "
                    "recompile a running program: keep input shapes, dtypes, the "
                    "train/eval mode, requires_grad flags, hooks and the model's parameter "
                    "objects as they were when it was compiled (e.g. use drop_last=True in "
                    "your DataLoader; freeze layers and register hooks before the first "
                    "step), or use a separate @cstorch.trace function for each signature.")
            warn(f"Compiling {self.step_fn.__name__!r} again because its signature changed "
                 f"({changed}). Each new signature costs a trace and a compilation.",
                 RecompilationWarning)
        positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        records = []
        passes = []  # one entry per time capture runs the step body
        counters_before = _step_counts(impl)
        leaves_gradients = []
        born_before = born_state.snapshot(impl)
        born_per_pass = []  # the state born in each pass (born_state.find)
        known_paths, existing = set(view.named_by), set(map(id, view.tensors))

        def step(*tensors):
            passes.append(None)
            rebuilt = list(leaves)
            for i, t in zip(positions, tensors):
                rebuilt[i] = t
            args, kwargs = pytree.tree_unflatten(rebuilt, spec)
            resets = impl.gradient_resets
            with impl.tracing(records), torch_optimizers.capture_policy(impl), \
                    born_state.ParameterWatch(impl):
                outputs = self.step_fn(*args, **kwargs)
            leaves_gradients.append(impl.gradient_resets == resets and any(
                p.grad is not None for model in impl.models for p in model.parameters()))
            born_per_pass.append(born_state.find(impl, known_paths, existing))
            return (outputs, [(r.args, r.kwargs) for r in records],
                    [b.tensor for b in born_per_pass[-1]])

        policy = impl.precision_policy()
        twins = [_metadata_twin(leaves[i], impl.layout) for i in positions]
        impl.initialize_sparsity()  # masks get their values before the step first reads them
        decompositions = decompositions_for("CSX" if impl.is_csx else "CPU")
        cache = CaptureCache(impl, self.step_fn, leaves, spec, view, twins, policy,
                             decompositions, traced_step_type=TracedStep,
                             trace_hooks=bool(_trace_pre_hooks or _trace_post_hooks),
                             lookup=not retry)
        hit = cache.load()
        born = []
        if hit is not None:  # the graph of an earlier run: nothing is traced
            captured, closures, counter_steps = hit
        else:
            try:
                with _capture_scope(), cache.watching():
                    captured = capture_step(step, view.slots, twins, policy,
                                            decompositions=decompositions)
                born = born_per_pass[-1] if born_per_pass else []
                born_state.refuse_parameters(born)
                born_state.check_no_leaks(impl, allowed=[id(b.tensor) for b in born])
            except BaseException:
                _undo_counting(counters_before, 0)  # a capture that stopped half-way
                born_state.discard(impl, born_before)
                raise
            counter_steps = _undo_counting(counters_before, len(passes))
            closures = [(r.kind, r.fn) for r in records]
            if born:
                cache.key = None  # runs once; its later calls are another capture's
            cache.prepare(captured, records, counter_steps)
        self.trace_count += 1
        program = Program(captured, policy=policy, layout=impl.layout,
                          platform=jax_backend.target.platform_of(impl.jax_devices[0]))
        python_leaves = tuple(None if isinstance(x, torch.Tensor) else x for x in leaves)
        used = [view.paths[i] for i in captured.used_state]
        written = [view.paths[i] for i in captured.written_state]
        avals = {view.paths[i]: view.aval(i)
                 for i in captured.used_state + captured.written_state}
        mine = set(used + written)
        ties = {slot: named for slot, named in view.named_by.items() if named in mine}
        entry = _CompiledStep(captured, program, closures, python_leaves, used, written, avals,
                              _hyperparameters(impl), counter_steps, view.optimizer_params,
                              ties, cache if cache.key is not None else None,
                              leaves_gradients=bool(leaves_gradients and leaves_gradients[-1]),
                              born=born, born_before=born_before)
        if not entry.born:
            self._programs.setdefault(key, []).append(entry)
        return entry

    def _evict_unused(self) -> None:
        """Keeps at most MAX_PROGRAMS programs (each holds megabytes of compiled code): a
        step fed ever-changing shapes would otherwise grow without bound."""
        limit = MAX_PROGRAMS.value
        while sum(len(entries) for entries in self._programs.values()) > limit:
            oldest = next(iter(self._programs))
            self._programs[oldest].pop(0)
            if not self._programs[oldest]:
                del self._programs[oldest]
            if not self._warned_evicted:
                self._warned_evicted = True
                warnings.warn(
                    f"{self.step_fn.__name__!r} has been compiled for more than {limit} "
                    "signatures; the least recently used programs are dropped and will be "
                    "compiled again if needed. Keep input shapes fixed (e.g. drop_last=True, "
                    "padding to a few bucket sizes) to avoid recompiling.",
                    RecompilationWarning, stacklevel=4)

    def _check_gradients_are_zeroed(self, impl, entry) -> None:
        """Warns once when a step that leaves its gradients un-zeroed is called again with
        no zero_grad in between: eager torch would add the new gradients to the old ones."""
        previous, self._resets_after_call = self._resets_after_call, impl.gradient_resets
        if entry.leaves_gradients and previous == impl.gradient_resets and previous is not None:
            entry.leaves_gradients = False  # once
            warn(f"{self.step_fn.__name__!r} computes gradients (backward) but neither the "
                 "step nor the code between its calls zeroes them (optimizer.zero_grad()). "
                 "Eager torch would add each step's gradients to the previous step's; a "
                 "compiled step starts every step from zero gradients (they do not persist "
                 "between steps), so the numbers differ from eager torch's. Call "
                 "optimizer.zero_grad() in the step, before backward; to accumulate gradients "
                 "on purpose, use a larger batch.", GradientAccumulationWarning)

    def _check_frozen(self, entry, leaves):
        if self._warned_frozen:
            return
        for old, new in zip(entry.python_leaves, leaves):
            if isinstance(new, torch.Tensor):
                continue
            try:
                same = old == new
                same = bool(same)
            except Exception:  # noqa: BLE001 - incomparable objects count as unchanged
                same = True
            if not same:
                self._warned_frozen = True
                warn(f"A non-tensor argument of {self.step_fn.__name__!r} changed from {old!r} "
                     f"to {new!r}, but the compiled step keeps the value it was traced with "
                     "(Python values are constants of the graph). Pass values that change "
                     "between steps as tensors.", FrozenValueWarning)
                return

    # -------------------------------------------------------------------------------- run
    def _run(self, impl, entry: _CompiledStep, leaves, view, used_index, written_index):
        captured, program = entry.captured, entry.program
        inputs = [_input_array(x) for x in leaves if isinstance(x, torch.Tensor)]
        seed = impl.draw_seed() if program.uses_rng else 0
        outputs = program.run(impl.device_state, [view.tensors[i] for i in used_index],
                              [view.tensors[i] for i in written_index], inputs, seed)

        produced = iter(outputs)
        flat = [LazyTensor(next(produced)) if is_tensor else constant
                for is_tensor, constant in zip(captured.output_is_tensor,
                                               captured.output_constants)]
        user_outputs, payloads, born = pytree.tree_unflatten(flat, captured.output_spec)
        if entry.born:
            self._give_birth(impl, entry, born)
        for (kind, fn), (args, kwargs) in zip(entry.closures, payloads):
            impl.add_step_closure(kind, fn, args, kwargs)
        for obj, increment in entry.counter_steps:
            obj._step_count += increment
        return user_outputs

    @staticmethod
    def _give_birth(impl, entry, values) -> None:
        """The born tensors' end-of-step values become their device values (with a
        multi-device layout they go through the host and are placed at the next upload)."""
        tensors = [b.tensor for b in entry.born]
        if impl.layout is None:
            impl.device_state.update(tensors, [v.jax_array for v in values])
            return
        with torch.no_grad():
            for tensor, value in zip(tensors, values):
                tensor.copy_(value.materialize())

    # ----------------------------------------------------------------------- introspection
    def _latest(self) -> _CompiledStep:
        if not self._programs:
            raise RuntimeError(
                f"{self.step_fn.__name__!r} has not been compiled yet; call it once first.")
        return self._programs[self._last_key][-1]

    def _example_arguments(self, entry):
        view = current_backend_impl().state_view()
        positions = entry.resolve(view)
        if positions is None:
            raise RuntimeError("The state this program was compiled for no longer exists.")
        used = current_backend_impl().device_state.arrays([view.tensors[i] for i in positions[0]])
        return used, entry.program.input_specs(), 0

    def jaxpr(self):
        """The jaxpr of the most recently compiled program."""
        entry = self._latest()
        return entry.program.jaxpr(*self._example_arguments(entry))

    def stablehlo(self) -> str:
        """The StableHLO text of the most recently compiled program."""
        entry = self._latest()
        return entry.program.stablehlo(*self._example_arguments(entry))

    def cost_analysis(self):
        entry = self._latest()
        return entry.program.cost_analysis(*self._example_arguments(entry))

    def pure_function(self):
        """The most recent program as a pure JAX function (not jitted):
        ``(donated_state, kept_state, inputs, seed) -> (new_state, outputs)``, lists of arrays
        in the program's order; ``seed`` is the int64 scalar its random ops are keyed from
        (see ``jax_backend.Program.pure_step``). :meth:`pure_state` gives the state it takes;
        ``new_state`` is the state the step writes, which ``PureState.advance`` puts back::

            f, state = jax.jit(step.pure_function()), step.pure_state()
            with jax.enable_x64(True):  # int64/float64 state keeps its dtypes
                new_state, outputs = f(state.donated, state.kept, [x, y], 0)
            state = state.advance(new_state)

        Called directly it runs in the engine's JAX settings (64-bit types,
        ``jax_backend.jax_settings``); inside your own ``jax.jit``, turn 64-bit types on for
        the call as above (JAX narrows int64/float64 arguments otherwise).
        """
        return in_engine_scope(self._latest().program.pure_step)

    def pure_state(self) -> "PureState":
        """The current state arrays of the most recent program, in the order
        :meth:`pure_function` takes them, with their names (``model0.fc.weight``,
        ``optimizer0.state.0.exp_avg``, ...). These are the live arrays: a later call of the
        cstorch step donates (deletes) those in ``donated``; copy them to keep them."""
        entry = self._latest()
        impl = current_backend_impl()
        view = impl.state_view()
        positions = entry.resolve(view)
        if positions is None:
            raise RuntimeError("The state this program was compiled for no longer exists; "
                               "call the step once more.")
        used_index, written_index = positions
        arrays = impl.device_state.arrays([view.tensors[i] for i in used_index])
        names = [state_name(view.paths[i]) for i in used_index]
        program = entry.program
        donated, kept = program.split_state(arrays)
        donated_names, kept_names = program.split_state(names)
        return PureState(donated, kept, donated_names, kept_names,
                         [state_name(view.paths[i]) for i in written_index])


class PureState(NamedTuple):
    """The state a traced step's pure function takes (``TracedStep.pure_state``)."""

    donated: list  # arrays the step overwrites, in the order the pure function takes them
    kept: list  # arrays it only reads
    donated_names: list
    kept_names: list
    written_names: list  # the names of ``new_state``'s arrays, in its order

    def advance(self, new_state) -> "PureState":
        """The state for the next step, given the ``new_state`` the pure function returned."""
        if len(new_state) != len(self.written_names):
            raise ValueError(f"new_state has {len(new_state)} arrays; the step writes "
                             f"{len(self.written_names)}.")
        written = dict(zip(self.written_names, new_state))
        return self._replace(donated=[written[name] for name in self.donated_names])


def _describe_change(old: ProgramSignature, new: ProgramSignature, step_fn=None,
                     reason=None) -> str:
    changed = [_FIELD_NAMES.get(field, field.replace("_", " "))
               for field, a, b in zip(ProgramSignature._fields, old, new) if a != b]
    if old.input_shapes_dtypes != new.input_shapes_dtypes and old.input_structure == \
            new.input_structure:
        changed[changed.index("input shapes/dtypes")] = (
            "input shapes/dtypes: " + _describe_inputs(old, new, step_fn)
            + "; a smaller last batch is the usual cause: use drop_last=True in the DataLoader")
    if reason:
        changed.append(reason)
    return ", ".join(changed) or (
        "an optimizer hyperparameter that is a Python number changed, or the state the step "
        "uses changed shape or dtype; schedule hyperparameters with a cstorch scheduler (or "
        "store them as tensors) to change them without recompiling")


def _describe_inputs(old: ProgramSignature, new: ProgramSignature, step_fn) -> str:
    """``inputs (args[0]) float32[32, 784] -> float32[16, 784]`` for each changed input."""
    paths = [keys for keys, _ in pytree.tree_flatten_with_path(pytree.tree_unflatten(
        list(range(len(new.input_shapes_dtypes))), new.input_structure))[0]]
    try:
        names = list(inspect.signature(step_fn).parameters) if step_fn is not None else []
    except (TypeError, ValueError):
        names = []
    parts = []
    for keys, a, b in zip(paths, old.input_shapes_dtypes, new.input_shapes_dtypes):
        if a == b or a is None or b is None:
            continue
        label = pytree.keystr(keys)  # "[0][1]": args[1], "[1]['mask']": kwargs["mask"]
        if len(keys) >= 2 and keys[0] == pytree.SequenceKey(0) and \
                isinstance(keys[1], pytree.SequenceKey) and keys[1].idx < len(names):
            label = names[keys[1].idx] + pytree.keystr(keys[2:])
        elif len(keys) >= 2 and keys[0] == pytree.SequenceKey(1) and \
                isinstance(keys[1], pytree.MappingKey):
            label = str(keys[1].key) + pytree.keystr(keys[2:])
        parts.append(f"{label} {_aval(a)} -> {_aval(b)}")
    return ", ".join(parts)


def _aval(shape_dtype) -> str:
    shape, dtype = shape_dtype
    return f"{str(dtype).replace('torch.', '')}[{', '.join(map(str, shape))}]"


def trace(step_fn: Callable) -> TracedStep:
    """Decorates a training or evaluation step: forward, ``loss.backward()``, optimizer and
    scheduler steps in one function.

    Its first call captures the whole step once (the body runs once, with tensors that have no
    values: read them in a ``@cstorch.step_closure``) and compiles it with ``jax.jit``; every
    later call with inputs of the same shapes and dtypes runs that program. New input shapes or
    changed Python-number hyperparameters compile another program (with a warning; CSX
    refuses). The decorated step also offers ``pure_function()``, ``pure_state()``,
    ``jaxpr()``, ``stablehlo()`` and ``cost_analysis()`` (see the guide's JAX hand-off)."""
    return TracedStep(step_fn)
