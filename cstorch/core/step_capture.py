"""Capturing a traced step and building its program: what ``TracedStep`` does when its
program table has no program for a call.

``capture`` runs the step body once under the engine's capture (``jax_backend.capture_step``)
or loads its graph from the persistent graph cache (``capture_cache``), with the user's trace
hooks around it; the Python counters the body advanced are put back and recorded as what
one step adds, and state born in the step (``born_state``) is found. ``build`` makes the
``programs.CompiledStep``: the jitted ``Program`` and what it was compiled for.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses

import torch
from torch.utils import _pytree as pytree
from torch.utils.hooks import RemovableHandle

import jax_backend
from jax_backend import LazyTensor, Program, capture_step
from cstorch.core import born_state, torch_optimizers
from cstorch.core.capture_cache import CaptureCache
from cstorch.core.programs import CompiledStep, ProgramSignature, hyperparameters
from cstorch.decomp.registry import decompositions_for
from cstorch.experimental import listener

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
    and the metrics' and grad scalers' traced values, is scoped by ``impl.tracing``.)"""
    for hook in list(_trace_pre_hooks.values()):
        hook()
    try:
        with listener.listening():
            yield
    finally:
        for hook in list(_trace_post_hooks.values()):
            hook()


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


@dataclasses.dataclass
class Capture:
    """What ``capture`` gives ``build``."""

    captured: jax_backend.CapturedStep
    closures: list  # (kind, fn) per closure recorded during the trace
    counter_steps: list  # (optimizer or scheduler, how much one step adds to its _step_count)
    policy: jax_backend.Policy
    cache: CaptureCache | None  # where the graph goes after the first good run, if anywhere
    leaves_gradients: bool  # computes gradients and does not zero them
    born: list  # the state born in the step
    born_before: dict  # born_state.snapshot before the capture (to undo it)


def capture(step_fn, impl, key: ProgramSignature, leaves, spec, view, *, retry: bool,
            traced_step_type: type) -> Capture:
    """Captures ``step_fn`` for these flattened arguments on the state of ``view`` (or loads
    its graph from the graph cache, unless ``retry``: its cached graph failed)."""
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
            outputs = step_fn(*args, **kwargs)
        leaves_gradients.append(impl.gradient_resets == resets and any(
            p.grad is not None for model in impl.models for p in model.parameters()))
        born_per_pass.append(born_state.find(impl, known_paths, existing))
        return (outputs, [(r.args, r.kwargs) for r in records],
                [b.tensor for b in born_per_pass[-1]])

    policy = impl.precision_policy()
    twins = [_metadata_twin(leaves[i], impl.layout) for i in positions]
    impl.initialize_sparsity()  # masks get their values before the step first reads them
    decompositions = decompositions_for("CSX" if impl.is_csx else "CPU")
    cache = CaptureCache(impl, step_fn, leaves, key, view, twins, decompositions,
                         traced_step_type=traced_step_type,
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
    return Capture(captured, closures, counter_steps, policy,
                   cache if cache.key is not None else None,
                   bool(leaves_gradients and leaves_gradients[-1]), born, born_before)


def build(impl, done: Capture, leaves, view) -> CompiledStep:
    """The program of a capture, and what it was compiled for (the state's paths, shapes,
    dtypes and ties, the optimizers' hyperparameters and parameters, the non-tensor
    arguments)."""
    captured = done.captured
    program = Program(captured, policy=done.policy, layout=impl.layout,
                      platform=jax_backend.target.platform_of(impl.jax_devices[0]))
    python_leaves = tuple(None if isinstance(x, torch.Tensor) else x for x in leaves)
    used = [view.paths[i] for i in captured.used_state]
    written = [view.paths[i] for i in captured.written_state]
    avals = {view.paths[i]: view.aval(i)
             for i in captured.used_state + captured.written_state}
    mine = set(used + written)
    ties = {slot: named for slot, named in view.named_by.items() if named in mine}
    return CompiledStep(captured, program, done.closures, python_leaves, used, written, avals,
                        hyperparameters(impl), done.counter_steps, view.optimizer_params,
                        ties, done.cache, leaves_gradients=done.leaves_gradients,
                        born=done.born, born_before=done.born_before)
