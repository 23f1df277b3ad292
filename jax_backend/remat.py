"""Activation checkpointing (``torch.utils.checkpoint``) as rematerialization in a compiled step.

Under capture, torch's checkpoint already puts the right computation in the graph: the
checkpointed function runs once in the forward part and again in the backward part (its
recomputation), whose results the backward reads. But the recomputation is the same pure
computation on the same values as the forward one, so XLA merges the two (CSE), and every
activation lives from the forward to the backward again: the compiled step's memory does not
drop (issue 44).

This module keeps the recomputation apart, as ``jax.checkpoint``'s ``prevent_cse`` does.
While ``recomputation_marked()`` is active (capture enters it around its trace), the
recomputation of every checkpointed region passes its tensor arguments through
``cstorch::remat_barrier``, an identity (its gradient too) that also takes a value of the
backward pass computed just before the recomputation: the gradient flowing into the region
for the reentrant implementation, else the newest value of the trace. Its lowering is a
``jax.lax.optimization_barrier`` over both, which GPU and TPU pipelines keep until after
their CSE; XLA's CPU pipeline removes barriers first, so on the CPU (and for an export to
"any" platform) each value also goes through a ``select`` on a predicate that is always true
but computed from that backward value. XLA can then neither merge the recomputation with the
forward nor start it before the backward reaches it.

A recomputation's random draws (dropout) are made the forward's, as eager torch makes them
by restoring the RNG state: the engine numbers random nodes in graph order, so a
recomputation would otherwise draw new numbers and differentiate another forward. The
forward's draws are kept for the backward (``_replay_random``).

The recomputation is found through torch's own objects, present from torch 2.4 to the
newest release this project supports (2.15): the non-reentrant implementation keeps the
function it re-runs as ``_CheckpointFrame.recompute_fn`` (called only to recompute), made
just before the region's forward; the reentrant one re-runs ``ctx.run_function`` in
``CheckpointFunction.backward``. They are patched only while a trace runs, and act only
under one (on its thread), so every binding of ``checkpoint`` (Hugging Face's models hold
their own, ``checkpoint_sequential``) is covered. A torch whose checkpoint is laid out
otherwise captures as before: no barrier, no error. Tests: tests/jax_backend/test_remat.py;
numbers: benchmarks/bench_remat.py and benchmarks/cpu_results.md.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import weakref
from typing import List

import jax
import jax.numpy as jnp
import torch
import torch.fx

from jax_backend import target
from jax_backend.registry import has_lowering, lookup, lowers
from jax_backend.user_frames import warn


@torch.library.custom_op("cstorch::remat_barrier", mutates_args=())
def remat_barrier(values: List[torch.Tensor], after: List[torch.Tensor]) -> List[torch.Tensor]:
    """``values`` unchanged (copies: a custom op may not return its inputs), once every tensor
    of ``after`` is computed. Compiled, an ``optimization_barrier`` over both."""
    return [v.clone() for v in values]


@remat_barrier.register_fake
def _remat_barrier_fake(values, after):
    return [torch.empty_like(v) for v in values]


def _remat_barrier_setup(ctx, inputs, output):
    ctx.after = len(inputs[1])


def _remat_barrier_backward(ctx, grads):
    return list(grads), [None] * ctx.after


remat_barrier.register_autograd(_remat_barrier_backward, setup_context=_remat_barrier_setup)


def _always_true(array):
    """A bool scalar that is true for every value of ``array`` (its first element's bits with
    the lowest one set are not zero), which XLA's simplifier cannot prove true."""
    first = jnp.ravel(array)[0]
    if jnp.iscomplexobj(first):
        first = jnp.real(first)
    if first.dtype == jnp.bool_:
        first = first.astype(jnp.uint8)
    elif jnp.issubdtype(first.dtype, jnp.floating):
        first = jax.lax.bitcast_convert_type(first, jnp.dtype(f"uint{first.dtype.itemsize * 8}"))
    return (first | 1) != 0


@lowers(torch.ops.cstorch.remat_barrier.default)
def _lower_remat_barrier(values, after):
    """An ``optimization_barrier`` over ``values`` and ``after`` keeps the recomputation
    apart on GPU and TPU. XLA's CPU pipeline removes barriers before its CSE pass, so there
    (and for "any" platform) each value also goes through a ``select`` on a predicate that is
    always true but computed from ``after``: the recomputation then reads other values than
    the forward (no CSE), and can only start once ``after`` is computed."""
    kept, after = jax.lax.optimization_barrier((list(values), list(after)))
    if target.current().platform not in ("cpu", "any"):
        return kept
    source = next((a for a in list(after) + kept if a.size), None)
    if source is None:
        return kept
    keep = _always_true(source)
    return [jnp.where(keep, v, jnp.zeros_like(v)) for v in kept]


_BARRIER = torch.ops.cstorch.remat_barrier.default
# How far back from the newest node of the trace the anchor of a barrier is looked for.
_ANCHOR_SEARCH = 64
# A trace's random nodes that a recomputation drew, each replaced by the forward's draw.
_replayed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> {node: node}


def _proxy_mode():
    """The make_fx tracer's dispatch mode when one is active on this thread, else None.
    (``get_proxy_mode`` is torch's public spelling from 2.5; torch's checkpoint itself reads
    the private one this falls back to.)"""
    from torch.fx.experimental import proxy_tensor

    get = getattr(proxy_tensor, "get_proxy_mode", None)
    if get is not None:
        return get()
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)


def _traced_graph():
    """The graph being traced on this thread, or None outside a trace."""
    mode = _proxy_mode()
    return None if mode is None else mode.tracer.graph


def _newest(graph: torch.fx.Graph) -> torch.fx.Node:
    return next(iter(reversed(graph.nodes)))  # (torch 2.9's reversed node list is no iterator)


def _after(node: torch.fx.Node):
    """The nodes that follow ``node`` in its graph, in order."""
    node = node.next
    while node.op != "root":
        yield node
        node = node.next


def _is_value(node: torch.fx.Node) -> bool:
    """A node that computes a new floating tensor (not a view of one, not an input)."""
    if node.op != "call_function":
        return False
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
        return False
    schema = getattr(node.target, "_schema", None)
    returns = schema.returns if schema is not None else ()
    return not (returns and returns[0].alias_info is not None)


def _newest_value(graph: torch.fx.Graph):
    """The newest node of ``graph`` that computes a floating tensor, looking back a little."""
    for node in itertools.islice(reversed(graph.nodes), _ANCHOR_SEARCH):
        if node.op == "placeholder":
            return None
        if _is_value(node):
            return node
    return None


def _barrier(graph, tensors: list, after: list, anchor) -> list:
    """``remat_barrier(tensors, after)``; with no ``after``, the barrier's node in the trace
    is made to depend on ``anchor`` (a node of the trace) instead."""
    before = _newest(graph)
    result = remat_barrier(tensors, after)
    if not after and anchor is not None:
        node = next(
            (n for n in _after(before) if n.op == "call_function" and n.target is _BARRIER), None
        )
        if node is not None:
            node.args = (node.args[0], [anchor])
    return result


def _mark(graph, args: tuple, after) -> tuple:
    """``args`` with its tensors passed through barriers (those that require grad through one,
    the others through another, so no tensor's ``requires_grad`` changes)."""
    after = [t for t in (after or ()) if isinstance(t, torch.Tensor)]
    anchor = None if after else _newest_value(graph)
    marked = list(args)
    for grad in (True, False):
        where = [
            i
            for i, a in enumerate(marked)
            if isinstance(a, torch.Tensor) and a.requires_grad == grad
        ]
        if where:
            for i, value in zip(where, _barrier(graph, [marked[i] for i in where], after, anchor)):
                marked[i] = value
    return tuple(marked)


def _is_random(node: torch.fx.Node) -> bool:
    """A node that draws random numbers: torch tags it so, and its lowering takes a key (the
    trace holds in-place draws such as ``bernoulli_``, lowered once functionalized; an op
    that draws only with some arguments, as attention with dropout, is lowered without)."""
    op = node.target
    if (
        node.op != "call_function"
        or not isinstance(op, torch._ops.OpOverload)
        or torch.Tag.nondeterministic_seeded not in op.tags
    ):
        return False
    return not has_lowering(op) or lookup(op).random


def _same_draw(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    """Whether two random nodes draw alike: same op, non-tensor arguments and result."""
    if a.target is not b.target or len(a.args) != len(b.args) or a.kwargs != b.kwargs:
        return False
    plain = [
        (x, y)
        for x, y in zip(a.args, b.args)
        if not isinstance(x, torch.fx.Node) or not isinstance(y, torch.fx.Node)
    ]
    if any(x != y for x, y in plain):
        return False
    va, vb = a.meta.get("val"), b.meta.get("val")
    return (
        isinstance(va, torch.Tensor)
        and isinstance(vb, torch.Tensor)
        and va.shape == vb.shape
        and va.dtype == vb.dtype
    )


def _replay_random(graph, forward_start, recompute_start) -> None:
    """Makes the random draws of a recomputation (after ``recompute_start``) the forward's
    (the first ones after ``forward_start``), as eager torch's checkpoint does by restoring
    the RNG state. Each forward draw is copied where it is made (later in-place ops may
    change the drawn tensor), and each recomputation's draw becomes that copy: an in-place
    draw a ``copy_`` of it, a functional one a ``clone``. (The draw's key cannot be shared
    instead, as the engine numbers random nodes in graph order; so the forward's draws live
    until the backward, as an activation would.)"""
    replayed = _replayed.setdefault(graph, {})
    drawn = [n for n in _after(recompute_start) if _is_random(n)]
    if not drawn:
        return
    forward: list = []
    for node in _after(forward_start):
        if node is recompute_start or len(forward) == len(drawn):
            break
        if node in replayed:  # a recomputation's draw, now the forward's (nested regions)
            forward.append(replayed[node])
        elif _is_random(node):
            forward.append(node)
    if len(forward) != len(drawn) or not all(map(_same_draw, forward, drawn)):
        warn(
            "A checkpointed region's recomputation (torch.utils.checkpoint) draws other "
            "random numbers than its forward did, so its gradients are those of other "
            "draws. Draw the same random ops, in the same order, at every call."
        )
        return
    for original, draw in zip(forward, drawn):
        with graph.inserting_after(original):
            kept = graph.call_function(torch.ops.aten.clone.default, (original,))
        kept.meta["val"] = original.meta["val"]
        if _mutates_first_argument(draw.target):
            draw.target, draw.args = torch.ops.aten.copy_.default, (draw.args[0], kept)
        else:
            draw.target, draw.args = torch.ops.aten.clone.default, (kept,)
        draw.kwargs = {}
        replayed[draw] = original


def _mutates_first_argument(op) -> bool:
    arguments = op._schema.arguments
    return (
        bool(arguments) and arguments[0].alias_info is not None and arguments[0].alias_info.is_write
    )


def _recomputing(fn, after=None, start=None):
    """``fn`` calling through with its tensor arguments marked as a recomputation's, and its
    random draws replaced by those of the forward that began after the node ``start``."""

    @functools.wraps(fn)
    def recompute(*args, **kwargs):
        graph = _traced_graph()
        if graph is None:  # not under a capture's trace (another thread, eager torch)
            return fn(*args, **kwargs)
        begun = _newest(graph)
        try:
            return fn(*_mark(graph, args, after), **kwargs)
        finally:  # also when torch stops the recomputation early (by raising)
            if start is not None and start.graph is graph:
                _replay_random(graph, start, begun)

    return recompute


def _frame_init(original):
    """``_CheckpointFrame.__init__`` whose frame recomputes through barriers (the frame is
    made just before the forward of its region runs)."""

    @functools.wraps(original)
    def __init__(self, recompute_fn, *args, **kwargs):
        original(self, recompute_fn, *args, **kwargs)
        graph = _traced_graph()
        if graph is not None and getattr(self, "recompute_fn", None) is recompute_fn:
            self.recompute_fn = _recomputing(recompute_fn, start=_newest(graph))

    return __init__


_START = "_cstorch_remat_start"  # on a CheckpointFunction's ctx: where its forward began


def _function_forward(original):
    """``CheckpointFunction.forward`` noting where in the trace its region's forward began."""

    @functools.wraps(original)
    def forward(ctx, *args):
        graph = _traced_graph()
        if graph is not None:
            setattr(ctx, _START, _newest(graph))
        return original(ctx, *args)

    return forward


def _function_backward(original):
    """``CheckpointFunction.backward`` that re-runs the function through barriers that wait
    for the incoming gradients."""

    @functools.wraps(original)
    def backward(ctx, *grads):
        run = getattr(ctx, "run_function", None)
        if not callable(run):
            return original(ctx, *grads)
        ctx.run_function = _recomputing(run, after=grads, start=getattr(ctx, _START, None))
        try:
            return original(ctx, *grads)
        finally:
            ctx.run_function = run

    return backward


def _patches() -> list:
    """``(owner, attribute, replacement)`` for each hook this torch allows; none where its
    private names differ (then checkpointed regions capture as before). torch's private names
    are read here on purpose: the recomputation is only visible inside torch's checkpoint."""
    from torch.utils import checkpoint

    patches = []
    frame = getattr(checkpoint, "_CheckpointFrame", None)
    init = vars(frame).get("__init__") if isinstance(frame, type) else None
    if callable(init) and "recompute_fn" in init.__code__.co_varnames[:2]:
        patches.append((frame, "__init__", _frame_init(init)))
    function = getattr(checkpoint, "CheckpointFunction", None)
    members = vars(function) if isinstance(function, type) else {}
    forward, backward = members.get("forward"), members.get("backward")
    if isinstance(forward, staticmethod) and isinstance(backward, staticmethod):
        patches.append((function, "forward", staticmethod(_function_forward(forward.__func__))))
        patches.append((function, "backward", staticmethod(_function_backward(backward.__func__))))
    return patches


def hooks_installed() -> bool:
    """Whether torch's checkpoint is hooked now (while any trace runs)."""
    return bool(_installed)


_lock = threading.Lock()
_installed: list = []  # [(owner, attribute, original)] while any trace is marking
_users = 0


@contextlib.contextmanager
def recomputation_marked():
    """While active, torch's checkpoint recomputations traced on this thread pass their
    tensor inputs through ``cstorch::remat_barrier`` (see the module docstring). The hooks
    are torch's, so they are installed once for all threads while any trace runs; a
    checkpoint that is not under a trace (another thread, eager torch) runs as before."""
    global _users
    with _lock:
        if _users == 0:
            for owner, name, replacement in _patches():
                _installed.append((owner, name, vars(owner)[name]))
                setattr(owner, name, replacement)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                while _installed:
                    owner, name, original = _installed.pop()
                    setattr(owner, name, original)
