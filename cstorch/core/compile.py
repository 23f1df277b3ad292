"""``cstorch.compile`` and ``@cstorch.trace``.

``trace`` turns a training or eval step into a compiled program: the first call captures the
whole step (forward, backward, optimizer, scheduler) as one graph and jits it; every later
call with the same input signature is a single call of that program. The step body does not
run again, as on a Cerebras system. A new signature (shapes, dtypes, structure, train/eval
mode) compiles a new program, with a warning; the CSX backend refuses (the wafer cannot
recompile).

``TracedStep`` is a facade over three rooms: the program table that decides which program
serves a call (``programs``), the capture and build of a new one (``step_capture``), and
looking inside one (``step_introspection``); it runs the program itself.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch
from torch.utils import _pytree as pytree

import jax_backend
from jax_backend import LazyTensor
from jax_backend.dtypes import tensor_to_host
from jax_backend.errors import raise_interrupt_behind
from jax_backend.user_frames import warn
from cstorch.backend import (
    Backend, BackendType, backend as _backend_fn, current_backend_impl, implicit_cpu_backend)
from cstorch.core import born_state, step_capture, step_introspection, torch_optimizers
from cstorch.errors import MultipleBackendsError
from cstorch.core.state_names import state_name
from cstorch.core.engine import run_eagerly
from cstorch.core.programs import (
    MAX_PROGRAMS as MAX_PROGRAMS, CompiledStep, ProgramSignature as ProgramSignature,
    ProgramTable, RecompilationWarning as RecompilationWarning)
from cstorch.core.step_capture import (
    register_trace_fn_post_hook as register_trace_fn_post_hook,
    register_trace_fn_pre_hook as register_trace_fn_pre_hook)
from cstorch.core.step_introspection import PureState as PureState


class FrozenValueWarning(UserWarning):
    """A Python (non-tensor) argument of a traced step changed after compilation."""


class GradientAccumulationWarning(UserWarning):
    """A traced step computes gradients that nothing zeroes: eager torch would accumulate
    them across steps, a compiled step starts every step from zero gradients."""


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
        impl.gradients_reset(list(module.parameters()), set_to_none)
    torch.nn.Module.zero_grad(module, set_to_none)


# ------------------------------------------------------------------------------------ trace
@contextlib.contextmanager
def _interrupts_unwrapped():
    """A Ctrl-C that lands in Python code called from C code (a property numpy reads, a
    callback) comes out as a SystemError: the user's ``except KeyboardInterrupt`` gets the
    interrupt itself."""
    try:
        yield
    except SystemError as error:
        raise_interrupt_behind(error)
        raise


def _input_array(tensor):
    if isinstance(tensor, LazyTensor):
        return tensor.jax_array
    return tensor_to_host(tensor)


class TracedStep:
    """A step function compiled into one program per input signature: a call finds its
    program in the step's ``ProgramTable`` (``cstorch.core.programs``), captures and builds
    one on a miss, and runs it."""

    def __init__(self, step_fn: Callable):
        self.step_fn = step_fn
        self.trace_count = 0
        self._table = ProgramTable(step_fn)
        # torch optimizer floats whose exact value the step's Python code depends on: traced
        # as constants (step_capture.Respecialize)
        self._constant_scalars: set = set()
        self._warned_frozen = False
        self._resets_after_call = None  # backend.gradient_resets after the previous call
        functools.update_wrapper(self, step_fn)

    @property
    def programs(self) -> list:
        return self._table.programs

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
        with impl.running_step(), _interrupts_unwrapped():  # (closures wait for its end)
            if impl.engine == "eager":  # plain eager torch every step (cstorch.core.engine)
                outputs = run_eagerly(self.step_fn, impl, args, kwargs)
            else:
                outputs = self._call_compiled(impl, args, kwargs)
        # Outside a DataExecutor nothing else would run this step's closures.
        impl.run_closures_of_a_step_outside_executor(queued_before)
        if impl.data_executor_stack:  # the executor's progress display shows the loss
            impl.last_step_outputs = outputs
        return outputs

    def compile_only(self, *args, **kwargs) -> None:
        """Captures and compiles the step for these arguments as its first call would,
        without running the program (no state changes): compile-only runs, whose
        artifacts ``jaxpr()``, ``stablehlo()`` and ``cost_analysis()`` then describe."""
        impl = current_backend_impl()
        entry = self._program_for(impl, *pytree.tree_flatten((args, kwargs)))[0]
        if entry.born:  # the first run would give the born state its values: not run here
            self._undo_first_step_program(impl, entry)

    # ------------------------------------------------------------------------------- find
    def _program_for(self, impl, leaves, spec):
        """The compiled step for these arguments and the current state, compiled now if
        needed (without running it): ``(entry, key, view, positions)``. A torch optimizer
        the capture meets for the first time is adopted and the step captured again."""
        while True:
            try:
                return self._find_or_compile(impl, leaves, spec)
            except torch_optimizers.Unadopted as found:
                torch_optimizers.adopt(impl, found.optimizer)
            except step_capture.Respecialize as found:
                self._constant_scalars.update(found.paths)

    def _find_or_compile(self, impl, leaves, spec):
        table = self._table
        view = impl.state_view()
        key = self._table.signature(leaves, spec, impl, view)
        found = table.find(key, view, impl)
        if found is not None:
            entry, positions = found
            self._check_frozen(entry, leaves)
            return entry, key, view, positions
        entry = self._compile(impl, key, leaves, spec, view, reason=table.mismatch(key, view, impl))
        if entry.born:
            return self._with_born_state(impl, entry, leaves, spec)
        key = table.refile(entry, key, self._table.signature(leaves, spec, impl, view))
        positions = entry.resolve(view)
        table.evict()
        return entry, key, view, positions

    def _with_born_state(self, impl, born_entry, leaves, spec):
        """A first capture in which state was born (``born_state``): its tensors get real
        slots, and the step is captured again for every later call; ``born_entry`` runs
        this once."""
        born_state.install(impl, born_entry.born)
        view = impl.state_view()
        key = self._table.signature(leaves, spec, impl, view)
        try:  # announced with the first: one compilation of the call
            steady = self._compile(impl, key, leaves, spec, view, announce=False)
        except BaseException:
            born_state.discard(impl, born_entry.born_before)
            raise
        if steady.born:
            self._table.forget(steady)
            born_state.discard(impl, born_entry.born_before)
            raise jax_backend.CaptureError(
                f"{self.step_fn.__name__!r} creates new state ("
                f"{state_name(steady.born[0].paths[0])}) in its second step too: state born "
                "in a step is only supported in the first one (a lazily created optimizer "
                "state or buffer). Create it before the first step.")
        born_entry.steady = steady
        key = self._table.refile(steady, key, self._table.signature(leaves, spec, impl, view))
        return born_entry, key, view, born_entry.resolve(view)

    def _undo_first_step_program(self, impl, entry) -> None:
        """Forgets a program that creates state in the first step, not run (compile-only,
        export): the slots it would have filled are taken out, and the next call compiles
        both programs again."""
        born_state.discard(impl, entry.born_before)
        self._table.forget(entry.steady)

    # -------------------------------------------------------------------------------- call
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
            self._table.refile(entry, key, self._table.signature(leaves, spec, impl, view))
            outputs = self._run(impl, entry, leaves, view, *entry.resolve(view))
        if entry.cache is not None:  # the first good run: keep the graph for later runs
            entry.cache, cache = None, entry.cache
            cache.store()
        return outputs

    def _recapture(self, impl, key, leaves, spec, view, entry, error) -> CompiledStep:
        """A graph from the cache whose program failed before it ever ran (state is left as
        it was): drop it and capture the step again (whose graph then replaces it)."""
        entry.cache.discard()
        self._table.discard(key, entry)
        warn(f"The cached graph of {self.step_fn.__name__!r} failed ({type(error).__name__}: "
             f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}); it is "
             "captured again.", jax_backend.graph_cache.GraphCacheWarning)
        return self._compile(impl, key, leaves, spec, view, retry=True)

    # ----------------------------------------------------------------- capture and build
    def _compile(self, impl, key, leaves, spec, view, retry=False,
                 reason=None, announce=True) -> CompiledStep:
        """Captures the step for ``key`` (or loads its graph from the persistent cache),
        builds its program and files it in the table (unless it gives birth to state)."""
        if announce and not retry:
            self._table.announce_recompile(key, reason, impl.is_csx)
        done = step_capture.capture(self.step_fn, impl, key, leaves, spec, view, retry=retry,
                                    traced_step_type=TracedStep,
                                    constant_paths=frozenset(self._constant_scalars))
        self.trace_count += 1
        impl.compilations += 1
        if done.held_gradients_unread:
            self._table.held_gradients_unread = True
        entry = step_capture.build(impl, done, leaves, view)
        if not entry.born:
            self._table.add(key, entry)
        return entry

    # ------------------------------------------------------------------- checks of a call
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
    def _run(self, impl, entry: CompiledStep, leaves, view, used_index, written_index):
        captured, program = entry.captured, entry.program
        torch_optimizers.run_scheduler_steps(entry.host_calls, "before")
        inputs = [_input_array(x) for x in leaves if isinstance(x, torch.Tensor)]
        inputs += [torch_optimizers.read_scalar(impl, path) for path in entry.scalar_paths]
        seed = impl.draw_seed() if program.uses_rng else 0
        outputs = program.run(impl.device_state, [view.tensors[i] for i in used_index],
                              [view.tensors[i] for i in written_index], inputs, seed)
        torch_optimizers.run_scheduler_steps(entry.host_calls, "after")
        impl.gradients_held = frozenset(
            id(p) for p, held in zip(view.parameters, entry.gradients_held) if held)

        produced = iter(outputs)
        flat = [LazyTensor(next(produced)) if is_tensor else constant
                for is_tensor, constant in zip(captured.output_is_tensor,
                                               captured.output_constants)]
        for i in captured.scalar_outputs:  # a Python number computed from a runtime float
            flat[i] = flat[i].item()
        user_outputs, payloads, born, stored = pytree.tree_unflatten(flat, captured.output_spec)
        if entry.born:
            self._give_birth(impl, entry, born)
        for (attributes, name), value in zip(entry.stored_attributes, stored):
            attributes[name] = value  # a tensor the step keeps on a module (born_state)
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
    # (cstorch.core.step_introspection, on the program that served the last call)
    def _latest(self) -> CompiledStep:
        return self._table.latest()

    def _example_arguments(self, entry):
        return step_introspection.example_arguments(entry)

    def jaxpr(self):
        """The jaxpr of the most recently compiled program."""
        return step_introspection.jaxpr(self._latest())

    def stablehlo(self) -> str:
        """The StableHLO text of the most recently compiled program."""
        return step_introspection.stablehlo(self._latest())

    def cost_analysis(self):
        return step_introspection.cost_analysis(self._latest())

    def pure_function(self):
        """The most recent program as a pure JAX function (not jitted):
        ``(donated_state, kept_state, inputs, seed) -> (new_state, outputs)``, lists of arrays
        in the program's order; ``seed`` is the int64 scalar its random ops are keyed from
        (see ``jax_backend.Program.pure_step``). :meth:`pure_state` gives the state it takes;
        ``new_state`` is the state the step writes, which ``PureState.advance`` puts back.
        A step with a torch optimizer reads its floats (lr, betas, ...) at every call: they
        follow the batch in ``inputs`` (``state.hyperparameters``, named by
        ``state.hyperparameter_names``); given the batch alone, it uses their values at the
        time ``pure_function()`` was called::

            f, state = jax.jit(step.pure_function()), step.pure_state()
            with jax.enable_x64(True):  # int64/float64 state keeps its dtypes
                new_state, outputs = f(state.donated, state.kept, [x, y], 0)
            state = state.advance(new_state)

        Called directly it runs in the engine's JAX settings (64-bit types,
        ``jax_backend.jax_settings``); inside your own ``jax.jit``, turn 64-bit types on for
        the call as above (JAX narrows int64/float64 arguments otherwise).
        """
        return step_introspection.pure_function(self._latest())

    def pure_state(self) -> PureState:
        """The current state arrays of the most recent program, in the order
        :meth:`pure_function` takes them, with their names (``model0.fc.weight``,
        ``optimizer0.state.0.exp_avg``, ...). These are the live arrays: a later call of the
        cstorch step donates (deletes) those in ``donated``; copy them to keep them."""
        return step_introspection.pure_state(self._latest())


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
