"""Capturing a traced step and building its program: what ``TracedStep`` does when its
program table has no program for a call.

``capture`` runs the step body once for a ``StepCall`` under the engine's capture
(``jax_backend.capture_step``) or loads its graph from the persistent graph cache
(``capture_cache``), with the user's trace hooks around it; the Python counters the body
advanced are put back and recorded as what one step adds, and state born in the step
(``born_state``) is found: its ``CaptureResult``. ``build`` makes the
``programs.ProgramEntry``: the jitted ``Program`` and what it was compiled for.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

import jax_backend
from cstorch.core import born_state, torch_optimizers
from cstorch.core.capture_cache import CaptureCache
from cstorch.core.programs import ProgramEntry, ProgramSignature, hyperparameters
from cstorch.core.step_call import StepCall
from cstorch.decomp.registry import decompositions_for
from cstorch.experimental import listener
from jax_backend import LazyTensor, Program, capture_step, scalars
from jax_backend.errors import CstorchError

# User hooks run around every capture. OrderedDicts: RemovableHandle keeps a weak reference
# to its dict (a plain dict has none).
_trace_pre_hooks: dict = collections.OrderedDict()
_trace_post_hooks: dict = collections.OrderedDict()


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
    and the metrics' and grad scalers' traced values, is scoped by the backend's
    ``TraceScope``.)"""
    for hook in list(_trace_pre_hooks.values()):
        hook()
    try:
        with listener.listening():
            yield
    finally:
        for hook in list(_trace_post_hooks.values()):
            hook()


@contextlib.contextmanager
def _optimizer_step_pre_hook(hook):
    """``hook(optimizer, args, kwargs)`` before every optimizer step in the block."""
    handle = register_optimizer_step_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _step_counts(registry) -> list:
    """(object, _step_count) of every optimizer and scheduler of the backend."""
    return [
        (obj, obj._step_count)
        for obj in [*registry.optimizers, *registry.schedulers]
        if isinstance(getattr(obj, "_step_count", None), int)
    ]


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


class Respecialize(CstorchError):
    """The step's Python code depends on the exact value of some torch optimizer floats
    (``jax_backend.scalars``: VALUE): the capture stops, and the step is captured again with
    those floats as constants of the graph (``paths``)."""

    def __init__(self, paths):
        super().__init__(f"the step depends on the values of {paths}")
        self.paths = paths


@dataclasses.dataclass(frozen=True)
class CaptureResult:
    """What ``capture`` gives ``build``."""

    captured: jax_backend.CapturedStep
    closures: list  # (kind, fn) per closure recorded during the trace
    counter_steps: list  # (optimizer or scheduler, how much one step adds to its _step_count)
    policy: jax_backend.Policy
    graph: PendingGraph  # where the graph goes after the first good run, if anywhere
    leaves_gradients: bool  # computes gradients and does not zero them
    born: list  # the state born in the step
    born_before: dict  # born_state.snapshot before the capture (to undo it)
    stepped: list  # indices of the optimizers the step body stepped
    scalar_paths: list  # the torch optimizer floats the program takes, in input order
    scalar_conditions: list  # (path, SIGN or VALUE, condition) it was traced for
    host_calls: list  # torch LR scheduler steps to run at every call (torch_optimizers)
    gradients_held: tuple  # per model parameter: whether it holds a gradient after the step
    held_gradients_unread: bool  # frozen parameters held gradients no optimizer step read
    stored: list  # (model, module name, attribute) of the tensors it stores on modules


class PendingGraph:
    """The graph cache's side of a new program: the captured graph is stored after the
    program's first good run (a graph the cache gave has nothing to store), and a cached graph
    whose program failed before it ever ran is discarded. Either way the cache is let go then
    (it holds the state of the call it was made for)."""

    def __init__(self, cache: CaptureCache | None):
        self._cache = cache

    @property
    def from_cache(self) -> bool:
        """The program's graph came from the cache and is not yet confirmed by a run."""
        return self._cache is not None and self._cache.hit

    def ran(self) -> None:
        """The program ran well: its graph is stored (once)."""
        cache, self._cache = self._cache, None
        if cache is not None:
            cache.store()

    def failed(self) -> None:
        """The program of a cached graph failed before it ever ran: the entry is removed."""
        cache, self._cache = self._cache, None
        if cache is not None:
            cache.discard()


def _scalar_plan(scalar_entries, constant_paths, captured, born) -> tuple:
    """``(scalar_paths, scalar_conditions)`` of a capture over ``scalar_entries``, those at
    ``constant_paths`` traced as constants. Raises ``Respecialize`` when the graph depends on
    the exact value of a symbolic float (unless it runs once: state was born)."""
    paths = [path for path, _ in scalar_entries]
    exact = [paths[i] for i, kind in captured.scalar_kinds.items() if kind == scalars.VALUE]
    if exact and not born:
        raise Respecialize(exact)
    conditions = [
        (paths[i], kind, scalars.condition(kind, slot.get()))
        for i, kind in sorted(captured.scalar_kinds.items())
        for slot in [scalar_entries[i][1]]
    ]
    conditions += [
        (path, scalars.VALUE, slot.get()) for path, slot in scalar_entries if path in constant_paths
    ]
    return [paths[i] for i in captured.used_scalars], conditions


class _Body:
    """The step body as the engine traces it (a call per pass) and what its last pass
    left: the closures it recorded, the optimizers it stepped, the scheduler steps it
    deferred, the state it gave birth to, the tensors it stored on modules, the gradients
    it left."""

    def __init__(self, step_fn, call: StepCall, signature: ProgramSignature):
        self.step_fn, self.call, self.signature = step_fn, call, signature
        self.records, self.passes = [], 0
        self.stepped, self.host_calls = [], []
        self.born, self.stored = [], []
        self.attributes_before: dict = {}
        self.leaves_gradients = False  # computes gradients and does not zero them
        self.gradients_held = ()  # per parameter: holds a gradient after the body
        self.held_read = None  # an optimizer step read a frozen parameter's held gradient
        view = call.view
        self._known_paths, self._existing = set(view.named_by), set(map(id, view.tensors))

    def __call__(self, *tensors):
        backend, view = self.call.backend, self.call.view
        registry = backend.registry
        self.passes += 1
        self.records.clear()
        self.stepped.clear()
        self.host_calls.clear()
        args, kwargs = self.call.arguments(tensors)
        resets = backend.modes.gradient_resets
        seeded = self._seed_held_gradients()
        self.held_read = None

        def first_optimizer_step(optimizer, args, kwargs):
            if self.held_read is None:
                self.held_read = any(p.grad is grad for p, grad in seeded)

        self.attributes_before = born_state.module_attributes(registry)
        with (
            backend.trace.tracing(self.records),
            torch_optimizers.capture_policy(registry, self.stepped),
            torch_optimizers.deferred_scheduler_steps(self.stepped, self.host_calls),
            born_state.ParameterWatch(registry),
            _optimizer_step_pre_hook(first_optimizer_step),
        ):
            outputs = self.step_fn(*args, **kwargs)
        self.held_read = bool(self.held_read) if seeded else None
        self.gradients_held = tuple(p.grad is not None for p in view.parameters)
        self.leaves_gradients = backend.modes.gradient_resets == resets and any(
            p.grad is not None for model in registry.models for p in model.parameters()
        )
        self.born = born_state.find(registry, self._known_paths, self._existing)
        self.stored = born_state.stored_attributes(registry, [id(b.tensor) for b in self.born])
        return (
            outputs,
            [(r.args, r.kwargs) for r in self.records],
            [b.tensor for b in self.born],
            [tensor for _, tensor in self.stored],
        )

    def _seed_held_gradients(self) -> list:
        """The frozen parameters whose gradient eager torch would hold get a zero one (its
        value is not kept between steps): ``(parameter, gradient)``."""
        seeded = []
        with torch.no_grad():
            for p, held in zip(self.call.view.parameters, self.signature.gradients_held):
                if held:
                    p.grad = torch.zeros_like(p)
                    seeded.append((p, p.grad))
        return seeded

    def traced(self) -> dict:
        """What a graph cache entry keeps of the trace besides closures and counters."""
        return {
            "stepped": [
                i
                for i, o in enumerate(self.call.backend.registry.optimizers)
                if any(o is s for s in self.stepped)
            ],
            "host_calls": list(self.host_calls),
            "gradients_held": list(self.gradients_held),
            "stored": [list(path) for path, _ in self.stored],
        }


def capture(
    step_fn, call: StepCall, *, retry: bool, table, traced_step_type: type
) -> CaptureResult:
    """Captures ``step_fn`` for ``call`` on its state (or loads its graph from the graph
    cache, unless ``retry``: its cached graph failed). ``table``, the step's
    ``programs.ProgramTable``, gives the call's signature and the torch optimizer floats traced
    as constants (the others are runtime inputs); the cache names a ``traced_step_type``
    reachable from the step function by its function."""
    backend, view = call.backend, call.view
    registry = backend.registry
    signature, constant_paths = table.signature(call), table.constant_scalars
    body = _Body(step_fn, call, signature)
    counters_before = _step_counts(registry)
    born_before = born_state.snapshot(registry)
    scalar_entries = torch_optimizers.scalar_slots(registry)
    policy = backend.precision_policy()
    twins = [_metadata_twin(call.leaves[i], backend.layout) for i in call.tensor_positions]
    registry.initialize_sparsity()  # masks get their values before the step first reads them
    decompositions = decompositions_for("CSX" if backend.is_csx else "CPU")
    cache = CaptureCache(
        backend,
        step_fn,
        call.leaves,
        signature,
        view,
        twins,
        decompositions,
        traced_step_type=traced_step_type,
        trace_hooks=bool(_trace_pre_hooks or _trace_post_hooks),
        lookup=not retry,
    )
    hit = cache.load()
    born, unread = [], False
    if hit is not None:  # the graph of an earlier run: nothing is traced
        captured, closures, counter_steps, traced = hit
        constant_paths = traced["constant_paths"]
    else:
        symbolic = [i for i, (path, _) in enumerate(scalar_entries) if path not in constant_paths]
        try:
            with _capture_scope(), cache.watching():
                captured = capture_step(
                    body,
                    view.slots,
                    twins,
                    policy,
                    decompositions=decompositions,
                    scalar_slots=[slot for _, slot in scalar_entries],
                    symbolic=symbolic,
                )
            born_state.restore_attributes(registry, body.attributes_before)
            born = body.born
            born_state.refuse_parameters(born)
            born_state.check_no_leaks(registry, allowed=[id(b.tensor) for b in born])
            _scalar_plan(scalar_entries, constant_paths, captured, born)  # may respecialize
        except BaseException:
            born_state.restore_attributes(registry, body.attributes_before)
            _undo_counting(counters_before, 0)  # a capture that stopped half-way
            born_state.discard(registry, born_before)
            raise
        counter_steps = _undo_counting(counters_before, body.passes)
        closures = [(r.kind, r.fn) for r in body.records]
        traced = dict(
            body.traced(), constant_paths={p for p, _ in scalar_entries if p in constant_paths}
        )
        unread = body.held_read is False
        if born:  # runs once: its later calls are another capture's
            cache = None
        else:
            cache.prepare(captured, body.records, counter_steps, traced)
    scalar_paths, conditions = _scalar_plan(scalar_entries, constant_paths, captured, born)
    cacheable = cache is not None and cache.key is not None
    return CaptureResult(
        captured,
        closures,
        counter_steps,
        policy,
        PendingGraph(cache if cacheable else None),
        body.leaves_gradients,
        born,
        born_before,
        traced["stepped"],
        scalar_paths,
        conditions,
        traced["host_calls"],
        tuple(traced["gradients_held"]),
        unread,
        [tuple(path) for path in traced["stored"]],
    )


def build(call: StepCall, result: CaptureResult) -> ProgramEntry:
    """The program of a capture for ``call``, and what it was compiled for (the state's
    paths, shapes, dtypes and ties, the optimizers' hyperparameters and parameters, the
    non-tensor arguments)."""
    backend, view, captured = call.backend, call.view, result.captured
    program = Program(
        captured,
        policy=result.policy,
        layout=backend.layout,
        platform=jax_backend.target.platform_of(backend.jax_devices[0]),
    )
    used = [view.paths[i] for i in captured.used_state]
    written = [view.paths[i] for i in captured.written_state]
    avals = {view.paths[i]: view.aval(i) for i in captured.used_state + captured.written_state}
    mine = set(used + written)
    current = hyperparameters(backend.registry)
    uses = set(result.stepped) | {path[1] for path in result.scalar_paths}
    return ProgramEntry(
        captured=captured,
        program=program,
        closures=result.closures,
        python_leaves=call.python_leaves,
        used_paths=used,
        written_paths=written,
        state_avals=avals,
        hyperparameters={o: current[o] for o in sorted(uses)},
        counter_steps=result.counter_steps,
        optimizer_params=view.optimizer_params,
        ties={slot: named for slot, named in view.named_by.items() if named in mine},
        graph=result.graph,
        leaves_gradients=result.leaves_gradients,
        scalar_paths=result.scalar_paths,
        scalar_conditions=result.scalar_conditions,
        host_calls=result.host_calls,
        gradients_held=result.gradients_held,
        stored_attributes=born_state.attribute_holders(backend.registry, result.stored),
    )
