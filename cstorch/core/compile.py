"""``cstorch.compile`` and ``@cstorch.trace``.

``trace`` turns a training or eval step into a compiled program: the first call captures the
whole step (forward, backward, optimizer, scheduler) as one graph and jits it; every later
call with the same input signature is a single call of that program. The step body does not
run again, as on a Cerebras system. A new signature (shapes, dtypes, structure, train/eval
mode) compiles a new program, with a warning; the CSX backend refuses (the wafer cannot
recompile).

``TracedStep`` is a facade over four rooms: the program table that decides which program
serves a call (``programs``), the capture and build of a new one (``step_capture``), the
run of one (``step_run``) and looking inside one (``step_introspection``). Each call is one
``StepCall`` (``step_call``), built once, that all of them take.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch

import jax_backend
from cstorch.backend import (
    Backend,
    BackendType,
    backend as _backend_fn,
    current_backend_impl,
    implicit_cpu_backend,
)
from cstorch.core import born_state, step_capture, step_introspection, step_run, torch_optimizers
from cstorch.core.call_checks import (
    CallChecks,
    FrozenValueWarning as FrozenValueWarning,
    GradientAccumulationWarning as GradientAccumulationWarning,
)
from cstorch.core.engine import run_eagerly
from cstorch.core.programs import (
    MAX_PROGRAMS as MAX_PROGRAMS,
    ProgramEntry,
    ProgramSignature as ProgramSignature,
    ProgramTable,
    RecompilationWarning as RecompilationWarning,
)
from cstorch.core.state_names import state_name
from cstorch.core.step_call import StepCall
from cstorch.core.step_capture import (
    register_trace_fn_post_hook as register_trace_fn_post_hook,
    register_trace_fn_pre_hook as register_trace_fn_pre_hook,
)
from cstorch.core.step_introspection import PureState as PureState
from cstorch.errors import MultipleBackendsError
from jax_backend.errors import (
    CstorchRuntimeError,
    CstorchTypeError,
    CstorchValueError,
    raise_interrupt_behind,
)
from jax_backend.jax_settings import thread_settings_kept
from jax_backend.user_frames import warn


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
                f"cstorch.compile(model, cstorch.backend()), or nothing."
            )
        impl = _backend_fn(backend)._impl
    elif isinstance(backend, Backend):
        current = current_backend_impl(raise_exception=False)
        if backend._impl is not current:
            raise CstorchRuntimeError(
                "Compile got a different backend than the current backend. Pass the backend "
                "returned by cstorch.backend() (or nothing) to cstorch.compile."
            )
        impl = backend._impl
    else:
        raise CstorchTypeError(
            f"Expected backend to be a backend type string, a BackendType or a Backend, "
            f"got {type(backend).__name__}."
        )

    device = getattr(model, "cerebras_device", None)
    if device is not None and str(device) != str(impl.device):
        raise CstorchRuntimeError(
            f"The model was created for device {device} but the backend's device is "
            f"{impl.device}. Create the model under the current backend's device."
        )
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
    lazy = [
        f"{name or 'the model'} ({type(module).__name__})"
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.modules.lazy.LazyModuleMixin)
        and module.has_uninitialized_params()
    ]
    if lazy:
        raise CstorchValueError(
            f"cstorch.compile got a model with uninitialized lazy modules: {', '.join(lazy)}. "
            "Their parameters are created by the first forward pass, which a compiled step "
            "cannot do. Run one forward pass eagerly before compiling "
            "(`model(example_batch)`, as torch asks before building an optimizer), or give "
            "the layer its input size (e.g. `nn.Linear(in_features, out_features)`)."
        )


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
    raise CstorchTypeError(
        f"Expected a callable as the argument to apply, got {type(fn).__name__}. Pass a "
        "function of one module, or an object with an `apply(module)` method."
    )


def _zero_grad(module: torch.nn.Module, set_to_none: bool = True) -> None:
    """``Module.zero_grad`` that the backend counts (see ``GradientAccumulationWarning``)."""
    impl = current_backend_impl(raise_exception=False)
    if impl is not None:
        impl.modes.gradients_reset(list(module.parameters()), set_to_none)
    torch.nn.Module.zero_grad(module, set_to_none)


# ------------------------------------------------------------------------------------ trace
@contextlib.contextmanager
def _interrupts_unwrapped():
    """A Ctrl-C that lands in Python code called from C code (a property numpy reads, a
    callback) comes out as a SystemError: the user's ``except KeyboardInterrupt`` gets the
    interrupt itself; one that lands in an engine scope's exit leaves the user's JAX settings
    as they were (``jax_settings.thread_settings_kept``)."""
    with thread_settings_kept():
        try:
            yield
        except SystemError as error:
            raise_interrupt_behind(error)
            raise


class TracedStep(step_introspection.Introspection):
    """A step function compiled into one program per input signature: a call finds its
    program in the step's ``ProgramTable`` (``cstorch.core.programs``), captures and builds
    one on a miss (``step_capture``), and runs it (``step_run``). ``jaxpr()``,
    ``stablehlo()``, ``cost_analysis()``, ``pure_function()`` and ``pure_state()`` look inside
    the program that served the last call (``step_introspection``)."""

    def __init__(self, step_fn: Callable):
        self.step_fn = step_fn
        self.trace_count = 0
        self._table = ProgramTable(step_fn)
        self._checks = CallChecks(step_fn)
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
        queued_before = len(impl.closures.queued)
        with impl.closures.running_step(), _interrupts_unwrapped():  # (closures wait its end)
            if impl.engine == "eager":  # plain eager torch every step (cstorch.core.engine)
                outputs = run_eagerly(self.step_fn, impl, args, kwargs)
            else:
                outputs = self._call_compiled(StepCall.of(impl, args, kwargs))
        # Outside a DataExecutor nothing else would run this step's closures.
        impl.closures.run_closures_of_a_step_outside_executor(queued_before)
        impl.executors.step_returned(outputs)
        return outputs

    def compile_only(self, *args, **kwargs) -> None:
        """Captures and compiles the step for these arguments as its first call would,
        without running the program (no state changes): compile-only runs, whose
        artifacts ``jaxpr()``, ``stablehlo()`` and ``cost_analysis()`` then describe."""
        self.program_for(StepCall.of(current_backend_impl(), args, kwargs))

    def program_for(self, call: StepCall):
        """``(entry, call)``: the program that serves ``call``, compiled now if needed but not
        run (compile-only runs, ``cstorch.export``), and the call on the state it runs on.
        The entry is None for a first call that would give birth to state: that program
        makes the state's first values by running, so it is undone (the next call compiles
        it again)."""
        entry, call = self._serve(call)
        if entry.gives_birth:
            self._undo_first_step(call.backend, entry)
            return None, call
        return entry.next_program(), call

    # ------------------------------------------------------------------------------- find
    def _serve(self, call: StepCall):
        """``(entry, call)``: the table's entry for ``call``, compiled now if there is none
        (not run), and the call on the state it runs on. A torch optimizer the capture meets
        for the first time is adopted and the step captured again."""
        while True:
            try:
                entry = self._table.lookup(call)
                if entry is not None:
                    self._checks.arguments(entry.next_program(), call)
                    return entry, call
                self._table.announce_recompile(call)
                return self._compile(call)
            except torch_optimizers.Unadopted as found:
                torch_optimizers.adopt(call.backend, found.optimizer)
            except step_capture.Respecialize as found:
                self._table.learn(constant_scalars=found.paths)
            call = call.with_current_state()

    def _compile(self, call: StepCall, *, retry: bool = False):
        """Captures the step for ``call`` (or loads its graph from the graph cache, unless
        ``retry``), builds its program and files it: ``(entry, call)`` as ``_serve``."""
        result = self._capture(call, retry=retry)
        entry = step_capture.build(call, result)
        if result.born:
            entry, call = self._with_born_state(call, entry, result)
        self._table.file(call, entry)
        return entry, call

    def _capture(self, call: StepCall, *, retry: bool = False) -> step_capture.CaptureResult:
        result = step_capture.capture(
            self.step_fn, call, retry=retry, table=self._table, traced_step_type=TracedStep
        )
        self.trace_count += 1
        call.backend.executors.compiled()
        self._table.learn(held_gradients_unread=result.held_gradients_unread)
        return result

    def _with_born_state(self, call: StepCall, first, result):
        """A first capture in which state was born (``born_state``): its tensors get real
        slots, and the step is captured again for every later call. The pair of programs,
        and the call on the state with the born tensors."""
        born_state.install(call.backend.registry, result.born)
        call = call.with_current_state()
        try:
            again = self._capture(call)
            if again.born:
                raise jax_backend.CaptureError(
                    f"{self.step_fn.__name__!r} creates new state ("
                    f"{state_name(again.born[0].paths[0])}) in its second step too: state "
                    "born in a step is only supported in the first one (a lazily created "
                    "optimizer state or buffer). Create it before the first step."
                )
        except BaseException:
            born_state.discard(call.backend.registry, result.born_before)
            raise
        steady = step_capture.build(call, again)
        return born_state.FirstAndSteady(first, steady, result.born, result.born_before), call

    def _undo_first_step(self, backend, entry) -> None:
        """Forgets a pair of programs whose first did not run (it failed, or the call only
        compiled): the slots it would have filled are taken out, and the next call compiles
        both programs again."""
        entry.undo(backend)
        self._table.forget(entry)

    # -------------------------------------------------------------------------------- call
    def _call_compiled(self, call: StepCall):
        entry, call = self._serve(call)
        program = entry.next_program()
        self._checks.gradients_zeroed(call.backend.modes, program)
        try:
            outputs = self._run(call, entry, program)
        except Exception as error:  # re-raised unless a cached graph failed
            if entry.gives_birth:  # the state it would have given birth to is not there
                self._undo_first_step(call.backend, entry)
                raise
            if not program.graph.from_cache or program.program.has_run:
                raise
            entry, call = self._recapture(call, entry, program, error)
            program = entry.next_program()
            outputs = self._run(call, entry, program)
        program.graph.ran()  # the first good run: keep the graph for later runs
        return outputs

    def _run(self, call: StepCall, entry, program):
        outputs, born = step_run.run(call, program)
        if entry.gives_birth:
            entry.gave_birth(call.backend, born)
        return outputs

    def _recapture(self, call: StepCall, entry, program, error):
        """A graph from the cache whose program failed before it ever ran (state is left as
        it was): drop it and capture the step again (whose graph then replaces it)."""
        program.graph.failed()
        self._table.forget(entry)
        warn(
            f"The cached graph of {self.step_fn.__name__!r} failed ({type(error).__name__}: "
            f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}); it is "
            "captured again.",
            jax_backend.graph_cache.GraphCacheWarning,
        )
        return self._compile(call, retry=True)

    # ----------------------------------------------------------------------- introspection
    def _latest(self) -> ProgramEntry:  # what step_introspection.Introspection looks inside
        return self._table.latest()


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
