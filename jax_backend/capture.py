"""Capture: run a torch step function once under a tracer and return a functional ATen graph.

Every state tensor's contents are exchanged with a fake tensor of the same metadata for the
trace (``_exchange_contents``), so every reference to it sees the fake and then the real data
again. Two passes: ``make_fx`` with core-ATen decompositions over the step
(autograd runs under the tracer), then, unless every mutation writes a whole state tensor or a
fresh intermediate (``_simple_writes``, ``_functionalize_writes``), ``make_fx`` over
``torch.func.functionalize`` of that graph. The result, ``CapturedStep``, is a pure graph
``(*state, *inputs) -> (*new_state, *outputs)``. docs/ARCHITECTURE.md (section 2) has the
whole route of a step.
"""

from __future__ import annotations

import contextlib
import copyreg
import dataclasses
import functools
import operator
import os
import sys
import types
import warnings
from typing import Callable, Mapping, MutableMapping, Sequence

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from jax_backend import scalars
from jax_backend.errors import CaptureError, LoweringNotFoundError, ValueReadInTraceError
from jax_backend.precision import Policy
from jax_backend.registry import has_lowering, list_writes
from jax_backend.remat import recomputation_marked
from jax_backend.user_frames import (
    PACKAGE_DIR,
    TORCH_DIR,
    current_user_frame,
    user_frame,
    warn,
)

aten = torch.ops.aten

# Nodes that only mark profiler ranges; they have side effects, so DCE would keep them.
_DROPPED_TARGETS = {
    torch.ops.profiler._record_function_enter_new.default,
    torch.ops.profiler._record_function_exit._RecordFunction,
}


def _core_aten_table() -> dict:
    """torch's core-ATen decompositions without the entries for CompositeImplicitAutograd ops.

    ``core_aten_decompositions()`` (torch.export's table) adds an ``op.decompose`` entry for
    every CIA op, ~500 of them, found by walking the dispatcher: 0.1-0.2 s per process, the
    largest fixed cost of a first capture. ``make_fx`` below autograd does not need them: a
    CIA op is decomposed by its autograd kernel before it is traced, and one that still
    reaches the tracer (inside another decomposition) is decomposed by the tracer's own
    fallback, ``op.decompose``, which is what those entries call. The smaller table is that
    of the same function before the CIA entries are added (checked in
    ``tests/jax_backend/test_core_decompositions.py``)."""
    post_autograd = getattr(torch._decomp, "_core_aten_decompositions_post_autograd", None)
    return dict(post_autograd() if post_autograd is not None else core_aten_decompositions())


#: Ops the capture keeps whole though torch's table decomposes them; each has a lowering of its
#: own, tested against eager torch (``tests/jax_backend/test_whole_ops.py``):
#: - the backward ops of a transformer's layers and loss: their decompositions were ~0.1 s of a
#:   small transformer's ~0.5 s capture (layer norm's backward alone 8 ms a layer) and gave XLA
#:   more kernels for the same math (a gather and a scatter per loss);
#: - lerp, addcmul and addcdiv, which torch's multi-tensor optimizers apply to every parameter:
#:   a decomposed lerp is 11 nodes, ~9 ms of tracing (0.45 s an AdamW step of 52 tensors).
WHOLE_OPS = (
    aten.native_layer_norm_backward.default,
    aten.embedding_dense_backward.default,
    aten.gelu_backward.default,
    aten._log_softmax_backward_data.default,
    aten.nll_loss_forward.default,
    aten.nll_loss_backward.default,
    aten.lerp.Scalar,
    aten.lerp.Tensor,
    aten.addcmul.default,
    aten.addcdiv.default,
    # and their in-place forms, whose decompositions call torch's reference functions directly
    # (not the ops above); captured whole, functionalization makes them the ops above
    aten.lerp_.Scalar,
    aten.lerp_.Tensor,
    aten.addcmul_.default,
    aten.addcdiv_.default,
)


@functools.lru_cache(maxsize=1)
def core_decompositions() -> Mapping:
    """Core-ATen decompositions plus the batch-norm family, less CPU flash attention.

    torch keeps ``native_batch_norm`` whole in the core set, but its schema does not mark the
    running statistics as mutated, so functionalization would silently drop their update.
    Decomposing it (and its relatives) yields explicit ``copy_`` writes to the running stats.
    """
    from torch._decomp import decomposition_table

    table = _core_aten_table()
    for op in (
        aten.native_batch_norm.default,
        aten._native_batch_norm_legit.default,
        aten._native_batch_norm_legit.no_stats,
        aten._native_batch_norm_legit_functional.default,
        aten._native_batch_norm_legit_no_training.default,
        aten._batch_norm_with_update.default,
        aten._batch_norm_no_update.default,
    ):
        table[op] = decomposition_table[op]
    # Lowered whole (as its backward is): its decomposition is the slowest of a transformer's
    # trace, ~35 ms per attention layer, for the same math the lowering emits.
    table.pop(aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    for op in WHOLE_OPS:
        table.pop(op, None)
    table.update(foreach_decompositions())
    return types.MappingProxyType(table)  # shared: callers extend a copy


# ``_foreach_X`` ops whose per-tensor op is not ``torch.X`` / ``Tensor.X_``.
_FOREACH_SPECIAL: dict[str, Callable] = {
    "norm": lambda t, ord=2, dtype=None: torch.linalg.vector_norm(t, ord, dtype=dtype),
    "max": lambda t: torch.amax(t),
}


def _pointwise_product(kind: str):
    """``addcmul``/``addcdiv`` with ``value`` positional, as the foreach schemas pass it, and
    possibly a 0-dim tensor (the ``.Tensor`` overloads' per-tensor scalars)."""

    def functional(t, a, b, value=1):
        if isinstance(value, torch.Tensor):
            return t + (a * b if kind == "mul" else a / b) * value
        return getattr(torch, f"addc{kind}")(t, a, b, value=value)

    def inplace(t, a, b, value=1):
        if isinstance(value, torch.Tensor):
            return t.add_((a * b if kind == "mul" else a / b) * value)
        return getattr(t, f"addc{kind}_")(a, b, value=value)

    return functional, inplace


_ADDCMUL, _ADDCMUL_ = _pointwise_product("mul")
_ADDCDIV, _ADDCDIV_ = _pointwise_product("div")
_FOREACH_BY_SCALAR = {"maximum": torch.clamp_min, "minimum": torch.clamp_max}
# Ops whose in-place and functional forms are spelled differently per tensor.
_FOREACH_SPECIAL_INPLACE = {
    "zero": lambda t: t.zero_(),
    "copy": lambda t, src, non_blocking=False: t.copy_(src, non_blocking),
    "addcmul": _ADDCMUL_,
    "addcdiv": _ADDCDIV_,
}
_FOREACH_SPECIAL_FUNCTIONAL = {
    "zero": torch.zeros_like,
    "copy": lambda t, src, non_blocking=False: t.clone().copy_(src),
    "addcmul": _ADDCMUL,
    "addcdiv": _ADDCDIV,
}


def _foreach_decomposition(name: str, scalars_tensor: bool = False):
    """``aten._foreach_<op>[_]``: the per-tensor op on each element of its list arguments
    (one list of scalars counts as one scalar per tensor), returning the list, or, in place,
    nothing. torch's multi-tensor optimizer paths (``foreach=True``, and Adagrad's under a
    compiler) are made of these; torch has no decomposition for them."""
    inplace = name.endswith("_")
    base = name[len("_foreach_") :].rstrip("_")
    special = _FOREACH_SPECIAL.get(base) or (
        _FOREACH_SPECIAL_INPLACE if inplace else _FOREACH_SPECIAL_FUNCTIONAL
    ).get(base)

    def per_tensor(*args, **kwargs):
        if special is not None:
            return special(*args, **kwargs)
        if inplace and hasattr(torch.Tensor, base + "_") and base not in _FOREACH_BY_SCALAR:
            return getattr(args[0], base + "_")(*args[1:], **kwargs)
        function = getattr(torch, base)
        if base in _FOREACH_BY_SCALAR and not isinstance(args[1], torch.Tensor):
            function = _FOREACH_BY_SCALAR[base]  # torch.maximum takes no scalar
        result = function(*args, **kwargs)
        return args[0].copy_(result) if inplace else result  # (maximum_ has no method)

    def decomposed(*args, **kwargs):
        count = next(len(a) for a in args if isinstance(a, (list, tuple)))

        def pick(value, i):
            if isinstance(value, (list, tuple)):
                return value[i]
            if scalars_tensor and isinstance(value, torch.Tensor) and value.dim() == 1:
                return value[i]  # one scalar per tensor, held in a tensor
            return value

        results = [
            per_tensor(*[pick(a, i) for a in args], **{k: pick(v, i) for k, v in kwargs.items()})
            for i in range(count)
        ]
        return None if inplace else results

    return decomposed


@functools.lru_cache(maxsize=1)
def foreach_decompositions() -> dict:
    """Every ``aten._foreach_*`` overload (but ``_out`` ones and ``_foreach_mm``) mapped to
    its per-tensor decomposition (``_foreach_decomposition``)."""
    # (the dispatcher's op names: a third of the time of listing every schema, ~3 vs 10 ms)
    names = sorted(
        {
            name.split("::")[1].split(".")[0]
            for name in torch._C._dispatch_get_all_op_names()
            if name.startswith("aten::_foreach_")
        }
    )
    table = {}
    for name in names:
        base = name[len("_foreach_") :].rstrip("_")
        if base in ("mm", "powsum"):
            continue
        packet = getattr(aten, name)
        for overload in packet.overloads():
            if not overload.endswith("out"):
                table[getattr(packet, overload)] = _foreach_decomposition(
                    name, scalars_tensor=overload == "Tensor" and base in ("addcmul", "addcdiv")
                )
    return table


@dataclasses.dataclass(frozen=True)
class Slot:
    """A place that holds a state tensor: ``container[key]``.

    Slots let capture notice a step that *rebinds* a state entry (``group["lr"] = new``)
    instead of writing it in place; the new value becomes that state's next value.
    """

    container: MutableMapping
    key: object
    name: str = dataclasses.field(default="", compare=False)  # for messages; default: key

    def describe(self) -> str:
        return f"state {self.name or repr(self.key)}"

    def get(self):
        return self.container[self.key]

    def set(self, value):
        self.container[self.key] = value


@dataclasses.dataclass
class CapturedStep:
    """A captured step: a functional graph plus how its inputs and outputs map to state.

    ``graph`` takes ``(*state[i] for i in used_state, *inputs)`` and returns
    ``(*new_state[i] for i in written_state, *output_leaves)``.
    """

    graph: torch.fx.GraphModule
    used_state: list  # indices into the state list, in placeholder order
    written_state: list  # indices into the state list whose new values lead the outputs
    num_inputs: int
    output_spec: pytree.TreeSpec  # structure of the user's outputs
    output_is_tensor: list  # per output leaf: True if a graph output, else a constant
    output_constants: list  # non-tensor output leaves (None where the leaf is a tensor)
    locate: Callable | None = None  # op -> the user's line that calls it (for error messages)
    # Scalars (``jax_backend.scalars``): the positions, in the ``scalars`` given to
    # ``capture_step``, of those the graph reads (its placeholders after the inputs), what
    # of each one's value the graph depends on (position -> SIGN or VALUE), and which output
    # leaves are Python numbers computed from them.
    used_scalars: list = dataclasses.field(default_factory=list)
    scalar_kinds: dict = dataclasses.field(default_factory=dict)
    scalar_outputs: list = dataclasses.field(default_factory=list)


def _exchange_contents(a: torch.Tensor, b: torch.Tensor) -> None:
    """Swaps what two tensor objects are (class, attributes, TensorImpl), keeping identities.

    This is ``torch.utils.swap_tensors`` without its weakref check: the tracer's own
    weak-keyed tables hold weak references to the fakes, and user code may hold weak
    references to parameters; both are harmless because we swap back before anyone looks.
    """
    if copyreg._slotnames(type(a)) or copyreg._slotnames(type(b)):  # type: ignore[attr-defined]
        raise CaptureError(
            f"cannot trace with state tensors of type {type(a).__name__}/{type(b).__name__}: "
            "tensor subclasses with __slots__ are not supported as state."
        )
    a.__class__, b.__class__ = b.__class__, a.__class__
    a.__dict__, b.__dict__ = b.__dict__, a.__dict__
    torch._C._swap_tensor_impl(a, b)


def _fake_like(mode: FakeTensorMode, tensor: torch.Tensor) -> torch.Tensor:
    with mode:
        fake = torch.empty_strided(
            tuple(tensor.shape),
            tuple(tensor.stride()),
            dtype=tensor.dtype,
            requires_grad=tensor.requires_grad,
        )
    if isinstance(tensor, torch.nn.Parameter):
        fake._is_param = True  # keeps isinstance(p, nn.Parameter) true during the trace
    # Gradient hooks (``register_hook``, ``register_post_accumulate_grad_hook``) live on the
    # TensorImpl that is exchanged: the fake gets the same hook tables, so the trace runs
    # them as eager autograd would (the tables are shared: removals show too).
    with torch._C.DisableTorchFunctionSubclass():
        hooks, after = tensor._backward_hooks, tensor._post_accumulate_grad_hooks
    if hooks:
        fake._backward_hooks = hooks
    if after:
        fake._post_accumulate_grad_hooks = after
    return fake


def _op_name(op) -> str:
    return op.name().split("::")[-1].split(".")[0].rstrip("_")


class _OpLocator(TorchDispatchMode):
    """Notes the user's line that first dispatches an ATen op of a given name."""

    def __init__(self, op):
        super().__init__()
        self.name = _op_name(op)
        self.frame = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.frame is None and _op_name(func) == self.name:
            self.frame = current_user_frame()
        return func(*args, **(kwargs or {}))


_FAKE_REPR, _FAKE_FORMAT = FakeTensor.__repr__, FakeTensor.__format__


def _called_from_library() -> bool:
    """Whether the code asking for a fake tensor's text is torch or the engine (which may
    format tensors in messages) rather than the user's step."""
    caller = sys._getframe(2).f_code.co_filename
    return os.path.abspath(caller).startswith((TORCH_DIR, PACKAGE_DIR))


def _guarded_repr(self, *args, **kwargs):
    if _called_from_library():
        return _FAKE_REPR(self, *args, **kwargs)
    raise ValueReadInTraceError("Printing or formatting a tensor")


def _guarded_format(self, spec):
    if _called_from_library():
        return _FAKE_FORMAT(self, spec)
    raise ValueReadInTraceError("Printing or formatting a tensor")


@contextlib.contextmanager
def _values_unreadable():
    """Makes ``print(tensor)`` and ``f"{tensor:.3f}"`` in the user's step fail with an error
    that explains why, instead of printing 'FakeTensor(...)' or a confusing TypeError."""
    FakeTensor.__repr__, FakeTensor.__format__ = _guarded_repr, _guarded_format
    try:
        yield
    finally:
        FakeTensor.__repr__, FakeTensor.__format__ = _FAKE_REPR, _FAKE_FORMAT


@contextlib.contextmanager
def _state_faked(mode: FakeTensorMode, state: Sequence[torch.Tensor]):
    fakes = [_fake_like(mode, t) for t in state]
    done = []
    try:
        for real, fake in zip(state, fakes):
            _exchange_contents(real, fake)
            done.append((real, fake))
        yield
    finally:
        for real, fake in reversed(done):
            _exchange_contents(real, fake)


def _translate_trace_errors(err: BaseException) -> BaseException | None:
    frame = user_frame(err.__traceback__)
    if isinstance(err, DataDependentOutputException):
        return ValueReadInTraceError(
            "Reading a tensor's value (`.item()`, `float()`, `if tensor:`)", frame
        )
    if isinstance(err, DynamicOutputShapeException):
        return ValueReadInTraceError(
            f"An operation whose output shape depends on tensor values ({err.args[0] if err.args else ''})",
            frame,
        )
    if isinstance(err, RuntimeError) and "cannot be converted to Scalar" in str(err):
        return ValueReadInTraceError("Reading a tensor's value (`.item()`)", frame)
    if isinstance(err, ValueReadInTraceError) and err.user_frame is None:
        return ValueReadInTraceError(err.what, frame)
    return None


def _flat_outputs(outputs):
    """(graph outputs, structure, per leaf whether it is a graph output, constants, the
    positions of the leaves that are Python numbers computed from symbolic scalars)."""
    leaves, spec = pytree.tree_flatten(outputs)
    is_tensor = [isinstance(x, torch.Tensor) or scalars.is_symbolic(x) for x in leaves]
    constants = [None if t else x for x, t in zip(leaves, is_tensor)]
    numbers = [i for i, x in enumerate(leaves) if scalars.is_symbolic(x)]
    return [x for x, t in zip(leaves, is_tensor) if t], spec, is_tensor, constants, numbers


def capture_step(
    fn: Callable,
    slots: Sequence[Slot],
    inputs: Sequence[torch.Tensor],
    policy: Policy | None = None,
    decompositions: Mapping | None = None,
    scalar_slots: Sequence[scalars.ScalarSlot] = (),
    symbolic: Sequence[int] | None = None,
) -> CapturedStep:
    """Traces ``fn(*inputs)`` once, treating the tensors held by ``slots`` as state.

    ``fn`` may read and update state in place or rebind slots; it returns any pytree whose
    tensor leaves become graph outputs and whose other leaves are frozen constants. A mixed
    ``policy`` traces ``fn`` under autocast (see ``jax_backend.precision``).
    ``decompositions`` (``{OpOverload: fn}``) are used in this capture on top of the built-in
    table (``core_decompositions``), which they override. The floats held by
    ``scalar_slots`` (those at the positions ``symbolic``, default all) are symbolic during
    the trace: the graph takes those it reads as inputs after ``inputs``, and says what of
    their values it depends on (``jax_backend.scalars``).
    """
    if policy is not None and policy.is_mixed:
        fn = _under(policy.capture_context, fn)
    table = core_decompositions()
    if decompositions:
        table = {**table, **decompositions}
    state = _unique_state(slots)
    positions = list(range(len(scalar_slots)) if symbolic is None else symbolic)
    symbols = scalars.Symbols([scalar_slots[i].get() for i in positions]) if positions else None
    installed = list(
        zip([scalar_slots[i] for i in positions], symbols.values if symbols is not None else [])
    )
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_inputs = [mode.from_tensor(x) for x in inputs]
    graph, info = _trace(fn, slots, state, mode, fake_inputs, table, installed=installed)
    expanded = _expand_list_writes(graph)
    rebound_state = _rebound_state_indices(slots, state, info["rebound"])
    _check_constants(graph)

    simple = _simple_writes(graph, len(state))
    if simple is not None:
        functional = _functionalize_writes(graph, len(state), *simple)
    else:
        # Pass 2: functionalize. Inputs must not require grad: the graph already holds backward.
        if expanded:
            graph.recompile()  # the module runs its code, which the expansion made stale
        plain = [_fake_like(mode, t).detach() for t in state] + fake_inputs
        with mode:
            functional = make_fx(
                torch.func.functionalize(graph, remove="mutations"), decomposition_table=table
            )(*plain, *[s for _, s in installed])
    captured = _finalize(
        functional,
        len(state),
        len(inputs),
        rebound_state,
        info,
        _state_names(slots, state),
        scalar_positions=positions,
    )
    if symbols is not None:
        kinds = symbols.guards_by_slot()
        captured.scalar_kinds = {positions[i]: kind for i, kind in kinds.items()}
    captured.locate = _op_locator(fn, slots, inputs, table)
    missing = _first_missing_lowering(captured.graph)
    if missing is not None:
        raise LoweringNotFoundError(missing, captured.locate(missing))
    return captured


def _expand_list_writes(graph: torch.fx.GraphModule) -> bool:
    """Each node of an op that writes lists of tensors in place (``registry.writes_lists``:
    an optimizer's update of a param group) becomes its functional op, one ``getitem`` per
    written tensor and a ``copy_`` of it into that tensor: the graph tracing the functional
    op and those copies would have given (the rest of the capture sees nothing else), where
    tracing ~140 copies took a quarter of a transformer's capture. True if a node was expanded
    (the graph module's code is stale then)."""
    g, expanded = graph.graph, False
    for node in list(g.nodes):
        rule = list_writes(node.target) if node.op == "call_function" else None
        if rule is None:
            continue
        functional, positions = rule
        targets = [t for position in positions for t in node.args[position]]
        with g.inserting_before(node):
            value = g.call_function(functional, node.args, dict(node.kwargs))
            value.meta["val"] = [t.meta.get("val") for t in targets]
            for i, target in enumerate(targets):
                item = g.call_function(operator.getitem, (value, i))
                item.meta["val"] = target.meta.get("val")  # same shape, dtype and layout
                write = g.call_function(aten.copy_.default, (target, item))
                write.meta["val"] = target.meta.get("val")
        g.erase_node(node)
        expanded = True
    return expanded


def _mutated_arguments(node) -> list:
    """Positions of the arguments an ATen node writes to (from its schema's alias info)."""
    if node.op != "call_function" or not hasattr(node.target, "_schema"):
        return []
    return _mutated_arguments_of(node.target)


def _is_view(node) -> bool:
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def _functional_variant(node):
    """``aten.add.Tensor`` for an ``aten.add_.Tensor`` node, when it exists and is lowered;
    None for ops that change their input's metadata (``transpose_``) or have no variant."""
    op = node.target
    if torch.Tag.inplace_view in op.tags:
        return None
    name = op._schema.name.split("::")[-1]
    if not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(aten, name[:-1], None)
    variant = getattr(packet, op._overloadname, None) if packet is not None else None
    if variant is None or _mutated_arguments_of(variant) or not has_lowering(variant):
        return None
    return variant


def _mutated_arguments_of(op) -> list:
    return [
        i
        for i, a in enumerate(op._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]


# Views that are the whole tensor (same shape and strides): reading one reads the tensor.
_IDENTITY_VIEWS = {aten.alias.default, aten.detach.default}


def _is_fresh(node) -> bool:
    """A tensor an ATen op made, that aliases nothing (so writing it writes nothing else): its
    result, or one result of an op with several (layer norm's backward: the weight's and the
    bias's gradients, which gradient clipping then scales in place)."""
    if (
        node.op == "call_function"
        and node.target is operator.getitem
        and isinstance(node.args[0], torch.fx.Node)
    ):
        node = node.args[0]
    return (
        node.op == "call_function"
        and hasattr(node.target, "_schema")
        and not _is_view(node)
        and not _mutated_arguments(node)
    )


def _simple_writes(graph: torch.fx.GraphModule, num_state: int):
    """``(writes, tensor_of)`` for pass 1's graph when it can skip the functionalization pass
    (the slowest part of capture), else None. ``writes`` maps each write node to (the tensor it
    writes, its functional op or None for ``copy_``); ``tensor_of`` maps each node that *is* a
    written tensor (the tensor, its identity views, earlier writes' results) to that tensor.

    A graph qualifies when every mutation writes a state tensor (whole), a fresh intermediate
    or a view of one (a gradient's ``.t()``), by ``copy_`` or by an in-place op with a lowered
    functional variant (``add_`` -> ``add``); and nothing else that aliases the written memory
    (the base, other views) is read after the write, so only the written tensor's new value is
    ever observed. That is the usual shape of a training step once decomposed: optimizers,
    counters, clipping and running statistics update whole tensors. Anything else takes the
    general pass.
    """
    nodes = list(graph.graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    tensor_of = {n: n for n in [n for n in nodes if n.op == "placeholder"][:num_state]}
    root_of: dict = {}  # aliasing node -> the tensor whose memory it shares
    family: dict = {}  # root -> every node aliasing its memory (views, writes' results), in order
    writes = {}

    def alias(node, base):
        root_of[node] = root = root_of.get(base, base)
        family.setdefault(root, []).append(node)

    for node in nodes:
        mutated = _mutated_arguments(node)
        if mutated:
            target = node.args[0]
            if mutated != [0] or "out" in node.kwargs or not isinstance(target, torch.fx.Node):
                return None
            tensor = tensor_of.get(target)
            root = root_of.get(target, target)
            if tensor is None:  # first write: the target must be (a view of) a fresh tensor
                if not _is_fresh(root):
                    return None
                tensor = tensor_of[target] = target
            functional = None
            if node.target is not aten.copy_.default:
                functional = _functional_variant(node)
                if functional is None:
                    return None
            elif node.kwargs:
                return None
            readers = [root] + family.get(root, [])
            if any(
                tensor_of.get(n) is not tensor and position[user] > position[node]
                for n in readers
                for user in n.users
            ):
                return None
            writes[node] = (tensor, functional)
            tensor_of[node] = tensor
            alias(node, target)
        elif _is_view(node) and isinstance(node.args[0], torch.fx.Node):
            base = node.args[0]
            if node.target in _IDENTITY_VIEWS and (base in tensor_of or _is_fresh(base)):
                tensor_of[node] = tensor_of.setdefault(base, base)
            alias(node, base)
        elif node.target is operator.getitem and node.args[0] in root_of:
            alias(node, node.args[0])  # one output of a multi-output view (split)
    return writes, tensor_of


def _functionalize_writes(
    graph: torch.fx.GraphModule, num_state: int, writes: dict, tensor_of: dict
):
    """What functionalization does to a graph ``_simple_writes`` accepted: each write becomes
    a functional node holding the tensor's newest value, which every later read of the tensor
    (or of an identity view of it) uses; one trailing ``copy_`` per written state records its
    final value (as ``_finalize`` expects)."""
    g = graph.graph
    placeholders = [n for n in g.nodes if n.op == "placeholder"][:num_state]
    newest: dict = {}  # written tensor -> node holding its newest value
    for node in list(g.nodes):
        if node.op == "placeholder":
            continue
        for read in node.all_input_nodes:
            value = newest.get(tensor_of.get(read))
            if value is not None and value is not read:
                node.replace_input_with(read, value)
        if node not in writes:
            continue
        tensor, functional = writes[node]
        current = newest.get(tensor, tensor)
        with g.inserting_before(node):
            if functional is not None:  # x.add_(y) -> add(x, y), cast back to x's dtype
                value = g.call_function(functional, (current, *node.args[1:]), dict(node.kwargs))
            else:
                old, new = tensor.meta.get("val"), node.args[1].meta.get("val")
                same = (
                    isinstance(new, torch.Tensor)
                    and new.shape == old.shape
                    and new.dtype == old.dtype
                )
                value = (
                    node.args[1]
                    if same
                    else g.call_function(  # broadcasting or casting
                        aten.copy.default, (current, node.args[1])
                    )
                )
        if functional is not None or value is not node.args[1]:  # (unary ops: one arg)
            value.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(value)
        g.erase_node(node)
        newest[tensor] = value
    output_node = next(n for n in reversed(g.nodes) if n.op == "output")
    with g.inserting_before(output_node):
        for tensor in placeholders:
            if tensor in newest:
                g.call_function(aten.copy_.default, (tensor, newest[tensor]))
    return graph  # (not recompiled: _finalize edits it further and then does, ~15 ms each)


def _op_locator(fn, slots, inputs, table) -> Callable:
    """``locate(op)``: the user's line that first calls ``op`` in ``fn``, found by tracing
    ``fn`` again (only ever on failure, so a normal capture pays nothing for it). Keeps the
    inputs' metadata, not the inputs."""
    specs = [(tuple(x.shape), tuple(x.stride()), x.dtype) for x in inputs]

    def locate(op) -> str | None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fakes = [
            mode.from_tensor(torch.empty_strided(shape, stride, dtype=dtype))
            for shape, stride, dtype in specs
        ]
        locator = _OpLocator(op)
        try:
            _trace(fn, slots, _unique_state(slots), mode, fakes, table, locator=locator)
        except Exception:  # noqa: BLE001 - the caller raises the real error; only the line is lost
            return None
        return locator.frame

    return locate


def _under(context_factory, fn):
    def wrapped(*args):
        with context_factory():
            return fn(*args)

    return wrapped


def _trace(fn, slots, state, mode, fake_inputs, table, locator=None, installed=()):
    """Pass 1: make_fx over the step with state faked in place, and each ``(ScalarSlot,
    symbol)`` of ``installed`` holding its symbol; returns (graph, info)."""
    originals = [slot.get() for slot in slots]
    info = {}
    first_scalar = len(state) + len(fake_inputs)

    def traced(*flat):
        with (
            locator if locator is not None else contextlib.nullcontext(),
            _scalars_installed(installed, flat[first_scalar:]),
        ):
            outputs = fn(*flat[len(state) : first_scalar])
        leaves, spec, is_tensor, constants, numbers = _flat_outputs(outputs)
        rebound = [
            (i, slot.get())
            for i, (slot, original) in enumerate(zip(slots, originals))
            if slot.get() is not original
        ]
        info.update(
            spec=spec,
            is_tensor=is_tensor,
            constants=constants,
            numbers=numbers,
            rebound=[i for i, _ in rebound],
        )
        return [v for _, v in rebound] + leaves

    try:
        with (
            _state_faked(mode, state),
            mode,
            _values_unreadable(),
            warnings.catch_warnings(),
            recomputation_marked(),
        ):  # checkpointed regions: jax_backend/remat.py
            warnings.filterwarnings("ignore", message=".*non-writable tensors.*")
            graph = make_fx(traced, decomposition_table=table)(
                *state, *fake_inputs, *[symbol for _, symbol in installed]
            )
    except Exception as err:  # translated below or re-raised unchanged
        translated = _translate_trace_errors(err)
        if translated is not None:
            raise translated.with_traceback(None) from None
        raise
    finally:
        for slot, original in zip(slots, originals):
            if slot.get() is not original:
                slot.set(original)
    return graph, info


@contextlib.contextmanager
def _scalars_installed(installed, symbols):
    """Each scalar slot of ``installed`` holds its symbol (the trace's placeholder for it)
    while the step body runs; then its value again. A step that rebinds one itself would
    change it only in this one trace, so it is refused."""
    values = [slot.get() for slot, _ in installed]
    for (slot, _), symbol in zip(installed, symbols):
        slot.set(symbol)
    changed = []
    try:
        yield
        changed = [
            slot for (slot, _), symbol in zip(installed, symbols) if slot.get() is not symbol
        ]
    finally:
        for (slot, _), value in zip(installed, values):
            slot.set(value)
    if changed:
        raise CaptureError(
            f"The step sets {changed[0].name or changed[0].key!r} in Python. A compiled step "
            "runs its Python once, when it is traced, so the new value would be set once, "
            "not at every step. Set it between steps (before calling the step: it is read "
            "at every call), or let a scheduler set it (torch.optim.lr_scheduler's "
            "scheduler.step() may be called in the step)."
        )


def _first_missing_lowering(graph: torch.fx.GraphModule):
    for node in graph.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            if not has_lowering(node.target):
                return node.target
    return None


def _unique_state(slots):
    seen, state = set(), []
    for slot in slots:
        tensor = slot.get()
        if not isinstance(tensor, torch.Tensor):
            raise CaptureError(
                f"state slot {slot.key!r} holds {type(tensor).__name__}, not a tensor"
            )
        if id(tensor) not in seen:
            seen.add(id(tensor))
            state.append(tensor)
    return state


def _state_names(slots, state) -> list:
    """A description of each unique state tensor: its first slot's."""
    names: dict = {}
    for slot in slots:
        names.setdefault(id(slot.get()), slot.describe())
    return [names[id(t)] for t in state]


def _rebound_state_indices(slots, state, rebound_slots):
    index_of = {id(t): i for i, t in enumerate(state)}
    result = []
    for slot_index in rebound_slots:
        state_index = index_of[id(slots[slot_index].get())]
        if state_index in result:
            raise CaptureError(
                f"{slots[slot_index].describe()} was rebound twice in one step (two slots "
                "holding the same tensor were both assigned). Assign it once, or update it in "
                "place with `copy_`."
            )
        result.append(state_index)
    return result


def _check_constants(graph: torch.fx.GraphModule) -> None:
    """Tensors the step reads that are not state are baked in; parameters must not be."""
    for node in graph.graph.nodes:
        if node.op == "get_attr":
            value = getattr(graph, node.target)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                raise CaptureError(
                    f"The step uses a tensor that requires grad but is not part of any compiled "
                    f"model (shape {tuple(value.shape)}, dtype {value.dtype}). Its gradient "
                    "would be lost. Pass the module that owns it to `cstorch.compile`, or "
                    "register it as a parameter of a compiled module."
                )


def _finalize(
    graph: torch.fx.GraphModule,
    num_state: int,
    num_inputs: int,
    rebound_state: list,
    info: dict,
    state_names: list,
    scalar_positions: Sequence[int] = (),
) -> CapturedStep:
    nodes = graph.graph
    placeholders = [n for n in nodes.nodes if n.op == "placeholder"]
    state_nodes = placeholders[:num_state]
    output_node = next(n for n in reversed(nodes.nodes) if n.op == "output")

    # Trailing copy_(placeholder, value) writes are the new values of mutated inputs.
    for node in reversed(
        [n for n in nodes.nodes if n.op == "call_function" and n.target in _DROPPED_TARGETS]
    ):
        nodes.erase_node(node)
    new_values = {}
    for node in list(nodes.nodes):
        if node.op == "call_function" and node.target is aten.copy_.default:
            target = node.args[0]
            if target.op == "placeholder" and target in state_nodes:
                new_values[state_nodes.index(target)] = node.args[1]
            elif target.op == "placeholder":
                warn(
                    "The step modifies one of its input tensors in place; the change stays "
                    "inside the compiled step and is not written back to the caller's tensor."
                )
            else:
                raise CaptureError(
                    "The step modifies, in place, a tensor that is not part of the backend's "
                    "state (not a parameter or buffer of a compiled model, nor optimizer, "
                    "scheduler or metric state), so the change could not persist between "
                    "steps. Make it a buffer of a compiled module."
                )
            node.replace_all_uses_with(node.args[1])
            nodes.erase_node(node)

    flat_out = list(output_node.args[0])
    rebound_values = flat_out[: len(rebound_state)]
    user_values = flat_out[len(rebound_state) :]
    for state_index, value in zip(rebound_state, rebound_values):
        if state_index in new_values:
            raise CaptureError(
                f"{state_names[state_index]} was both modified in place and rebound in one "
                "step, so it has two new values. Do one or the other."
            )
        _check_rebinding(state_nodes[state_index], value, state_names[state_index])
        new_values[state_index] = value

    written = sorted(i for i, v in new_values.items() if v is not state_nodes[i])
    output_node.args = ([new_values[i] for i in written] + user_values,)
    nodes.eliminate_dead_code()

    used = [i for i, n in enumerate(state_nodes) if n.users]
    scalar_nodes = placeholders[num_state + num_inputs :]
    used_scalars = [p for p, n in zip(scalar_positions, scalar_nodes) if n.users]
    for node in state_nodes + scalar_nodes:
        if not node.users:
            nodes.erase_node(node)
    _forget_symbols(nodes)
    graph.recompile()
    return CapturedStep(
        graph=graph,
        used_state=used,
        written_state=written,
        num_inputs=num_inputs,
        output_spec=info["spec"],
        output_is_tensor=info["is_tensor"],
        output_constants=info["constants"],
        used_scalars=used_scalars,
        scalar_outputs=info["numbers"],
    )


def _forget_symbols(graph: torch.fx.Graph) -> None:
    """Replaces the symbolic Python numbers in node metadata with ``ScalarMeta`` (the trace's
    shape environment is not kept, and the graph cache stores plain data)."""
    kinds = {torch.SymFloat: "float", torch.SymInt: "int", torch.SymBool: "bool"}
    for node in graph.nodes:
        value = node.meta.get("val")
        if scalars.is_symbolic(value):
            node.meta["val"] = scalars.ScalarMeta(kinds[type(value)])
        for key in ("example_value", "unbacked_bindings"):
            node.meta.pop(key, None)


def _check_rebinding(placeholder, value, name):
    old, new = placeholder.meta.get("val"), getattr(value, "meta", {}).get("val")
    if not isinstance(new, torch.Tensor):
        raise CaptureError(f"{name} was rebound to something that is not a tensor")
    if tuple(old.shape) != tuple(new.shape) or old.dtype != new.dtype:
        raise CaptureError(
            f"{name} of shape {tuple(old.shape)} and dtype {old.dtype} was replaced by "
            f"one of shape {tuple(new.shape)} and dtype {new.dtype}; state must keep its shape "
            "and dtype across steps. Update it in place (`t.copy_(new)`) with a matching value."
        )
