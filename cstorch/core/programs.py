"""The program table of a traced step: which compiled program serves a call.

A traced step keeps one program per *signature* (``ProgramSignature``: the inputs' structure,
shapes and dtypes, the modules' train/eval modes, grad mode, precision policy, parameters'
``requires_grad`` and hooks) and, under one signature, one per state layout (the state a
program uses must still fit: ``ProgramEntry.resolve``) and per set of Python-number
hyperparameters. ``ProgramTable`` alone decides: it derives a call's signature
(``StepCall``), finds the program for it (``lookup``), files new ones under the signature the
capture left (``file``), forgets and evicts them (``cstorch.config``: max_programs), and says
why a call needs a new one (the recompile reason of ``RecompilationWarning``). An entry is a
``ProgramEntry`` or a ``born_state.FirstAndSteady`` (the two programs of a step whose first
call gives birth to state), selected alike.

The persistent graph cache (``cstorch.core.capture_cache``) keys its entries by
``persistent_signature``, a rendering of every field of the same signature as plain data,
so that what selects a program in memory and what selects a graph on disk cannot drift
apart (``tests/cstorch/core/test_programs.py`` fails for a field without a rendering).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
from typing import NamedTuple

import torch
from torch.utils import _pytree as pytree

import jax_backend
from cstorch import config
from cstorch.core import torch_optimizers
from cstorch.core.state_names import state_name
from cstorch.core.step_call import StepCall
from jax_backend import Program, scalars
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError
from jax_backend.graph_cache.fingerprint import handle_ranks
from jax_backend.user_frames import warn

#: How many compiled programs one traced step keeps (``cstorch.config``: max_programs).
MAX_PROGRAMS = config.max_programs


class RecompilationWarning(UserWarning):
    """A traced step was compiled again for a new input signature."""


# -------------------------------------------------------------------------------- signature
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
    gradients_held: tuple  # of every model parameter: frozen, it starts with a (zero) grad


def signature(call: StepCall) -> ProgramSignature:
    """The signature of ``call``, now."""
    tensors = tuple(
        (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else None for x in call.leaves
    )
    modes, module_hooks = call.backend.modes.module_modes_and_hooks()
    requires_grad, parameter_hooks, held = call.backend.modes.parameter_autograd(call.view)
    return ProgramSignature(
        call.spec,
        tensors,
        modes,
        torch.is_grad_enabled(),
        call.backend.precision_policy(),
        requires_grad,
        parameter_hooks,
        module_hooks,
        held,
    )


def _nested_lists(value):
    return [_nested_lists(v) for v in value] if isinstance(value, tuple) else value


def _inputs(shapes_dtypes) -> list:
    return [None if x is None else [list(x[0]), str(x[1])] for x in shapes_dtypes]


def _hook_entries_by_rank(hooks) -> list:
    """Hook entries (positions, then tuples of ``RemovableHandle`` ids) with each id replaced
    by its rank among the entries' ids (``fingerprint.handle_ranks``)."""
    rank = handle_ranks(
        h for entry in hooks for part in entry if isinstance(part, tuple) for h in part
    )
    return [
        [[rank[h] for h in part] if isinstance(part, tuple) else part for part in entry]
        for entry in hooks
    ]


#: field -> its persistent rendering (plain data, the same in every process).
_RENDERINGS = {
    "input_structure": repr,
    "input_shapes_dtypes": _inputs,
    "train_eval_modes": _nested_lists,
    "grad_mode": bool,
    "precision_policy": repr,
    "requires_grad": list,
    "parameter_hooks": _hook_entries_by_rank,
    "module_hooks": _hook_entries_by_rank,
    "gradients_held": list,
}


def persistent_signature(signature: ProgramSignature) -> dict:
    """Every field of ``signature`` as plain data (JSON), for the graph cache's key."""
    missing = [field for field in ProgramSignature._fields if field not in _RENDERINGS]
    if missing:
        raise CstorchTypeError(
            f"ProgramSignature fields without a persistent rendering: {missing}; "
            "add one to cstorch.core.programs._RENDERINGS."
        )
    return {field: _RENDERINGS[field](value) for field, value in zip(signature._fields, signature)}


# ------------------------------------------------------------------------ recompile reasons
_FIELD_NAMES = {
    "input_shapes_dtypes": "input shapes/dtypes",
    "train_eval_modes": "train/eval mode",
    "requires_grad": "requires_grad of a parameter (e.g. a layer frozen with "
    "requires_grad_(False))",
    "parameter_hooks": "hooks on parameters (register_hook)",
    "module_hooks": "module hooks (register_forward_hook and the like)",
    "gradients_held": "which frozen parameters hold a gradient (zero_grad with set_to_none)",
}


def describe_change(old: ProgramSignature, new: ProgramSignature, step_fn=None, reason=None) -> str:
    """Why ``new`` needs another program than ``old`` (``reason``: why the programs under
    ``new`` do not fit the state, if any), as the recompile warning says it."""
    changed = [
        _FIELD_NAMES.get(field, field.replace("_", " "))
        for field, a, b in zip(ProgramSignature._fields, old, new)
        if a != b
    ]
    if (
        old.input_shapes_dtypes != new.input_shapes_dtypes
        and old.input_structure == new.input_structure
    ):
        changed[changed.index("input shapes/dtypes")] = (
            "input shapes/dtypes: "
            + _describe_inputs(old, new, step_fn)
            + "; a smaller last batch is the usual cause: use drop_last=True in the DataLoader"
        )
    if reason:
        changed.append(reason)
    return ", ".join(changed) or (
        "a cstorch optimizer's hyperparameter that is a Python number changed, or the state "
        "the step uses changed shape or dtype; schedule a cstorch optimizer's hyperparameters "
        "with a cstorch scheduler (or store them as tensors) to change them without "
        "recompiling"
    )


def _describe_inputs(old: ProgramSignature, new: ProgramSignature, step_fn) -> str:
    """``inputs (args[0]) float32[32, 784] -> float32[16, 784]`` for each changed input."""
    paths = [
        keys
        for keys, _ in pytree.tree_flatten_with_path(
            pytree.tree_unflatten(list(range(len(new.input_shapes_dtypes))), new.input_structure)
        )[0]
    ]
    try:
        names = list(inspect.signature(step_fn).parameters) if step_fn is not None else []
    except (TypeError, ValueError):
        names = []
    parts = []
    for keys, a, b in zip(paths, old.input_shapes_dtypes, new.input_shapes_dtypes):
        if a == b or a is None or b is None:
            continue
        label = pytree.keystr(keys)  # "[0][1]": args[1], "[1]['mask']": kwargs["mask"]
        if (
            len(keys) >= 2
            and keys[0] == pytree.SequenceKey(0)
            and isinstance(keys[1], pytree.SequenceKey)
            and keys[1].idx < len(names)
        ):
            label = names[keys[1].idx] + pytree.keystr(keys[2:])
        elif (
            len(keys) >= 2
            and keys[0] == pytree.SequenceKey(1)
            and isinstance(keys[1], pytree.MappingKey)
        ):
            label = str(keys[1].key) + pytree.keystr(keys[2:])
        parts.append(f"{label} {_aval(a)} -> {_aval(b)}")
    return ", ".join(parts)


def _aval(shape_dtype) -> str:
    shape, dtype = shape_dtype
    return f"{str(dtype).replace('torch.', '')}[{', '.join(map(str, shape))}]"


# --------------------------------------------------------------------------- hyperparameters
def _frozen(value, runtime_floats: bool):
    """A comparable stand-in for a param-group value (tensors only count as "a tensor"; a
    torch optimizer's floats as "a float": the program reads their values at every call)."""
    if isinstance(value, torch.Tensor):
        return "<tensor>"
    if runtime_floats and scalars.is_runtime_scalar(value):
        return "<float>"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v, runtime_floats) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(_frozen(v, runtime_floats) for v in value)
    return repr(value)  # e.g. numpy arrays, whose == is elementwise


def hyperparameters(registry) -> list:
    """Per registered optimizer, its param-group values as they select a program (see
    ``_frozen``): what a program that steps the optimizer was traced with."""
    return [
        tuple(
            tuple((k, _frozen(v, runtime)) for k, v in group.items() if k != "params")
            for group in optimizer.param_groups
        )
        for optimizer, runtime in (
            (o, torch_optimizers.is_torch_optimizer(o)) for o in registry.optimizers
        )
    ]


# ------------------------------------------------------------------------------ one program
@dataclasses.dataclass(frozen=True, eq=False)
class ProgramEntry:
    """One compiled program of a traced step and what it was compiled for: a record, built
    once (``step_capture.build``)."""

    captured: jax_backend.CapturedStep
    program: Program
    closures: list  # (kind, fn) per closure recorded during the trace
    python_leaves: tuple  # the non-tensor arguments the graph was traced with
    used_paths: list  # state paths of the program's state inputs
    written_paths: list  # state paths of the program's state outputs
    state_avals: dict  # path -> (shape, dtype) the program was compiled for
    hyperparameters: dict  # optimizer index -> its group values, for those the step uses
    counter_steps: list  # (optimizer or scheduler, how much one step adds to its _step_count)
    optimizer_params: tuple  # per optimizer at compile time: the state paths it updates
    ties: dict  # slot path -> path of its tensor, for the slots of this program's state
    graph: object  # step_capture.PendingGraph: stored in the graph cache after a good run
    leaves_gradients: bool  # computes gradients and does not zero them
    # The torch optimizers' floats the program reads at every call (their paths, in input
    # order) and what it was traced for of some of them: (path, SIGN or VALUE, condition).
    scalar_paths: list
    scalar_conditions: list
    # Host calls a traced step made that run at every call instead: torch LR schedulers'
    # step(), as (phase "before" or "after" the program, function, args, kwargs).
    host_calls: list
    gradients_held: tuple  # per model parameter: whether it holds a gradient after
    stored_attributes: list  # (module __dict__, name) of the tensors it stores on modules
    _memo: dict = dataclasses.field(default_factory=dict, repr=False)  # answers per view

    def next_program(self) -> ProgramEntry:
        """The program the next call it serves runs: this one (see
        ``born_state.FirstAndSteady`` for an entry of two programs)."""
        return self

    @property
    def gives_birth(self) -> bool:
        """Whether that program gives birth to state: never for an entry of one program."""
        return False

    def changed_argument(self, call: StepCall) -> tuple | None:
        """``(traced, now)`` of the first non-tensor argument of ``call`` that differs from
        the value the graph was traced with (a constant of the graph), or None."""
        for old, new in zip(self.python_leaves, call.leaves):
            if isinstance(new, torch.Tensor):
                continue
            try:
                same = bool(old == new)
            except Exception:  # noqa: BLE001 - incomparable objects count as unchanged
                same = True
            if not same:
                return old, new
        return None

    def hyperparameter_mismatch(self, current: list, registry) -> str | None:
        """Why this program cannot serve the optimizers' param groups as they are, or None.
        It serves groups that hold what it was traced with: the same keys, the same
        non-float values (Python numbers that are not a torch optimizer's floats are
        constants of the graph), tensors where there were tensors, and for the floats it
        reads, values that meet its conditions (``jax_backend.scalars``)."""
        for o, values in self.hyperparameters.items():
            if o >= len(current) or current[o] != values:
                return (
                    f"a hyperparameter of optimizer {o} that is a constant of the "
                    "compiled step changed (a cstorch optimizer's number, a torch "
                    "optimizer's flag or int, a tensor set or removed, a param group)"
                )
        for path, kind, traced in self.scalar_conditions:
            value = torch_optimizers.read_scalar(registry, path)
            if value is None or scalars.condition(kind, value) != traced:
                what = "the sign of" if kind == scalars.SIGN else "the value of"
                return (
                    f"{what} {state_name(path)} changed (the step's Python code "
                    "depends on it, e.g. `if weight_decay != 0`)"
                )
        for path in self.scalar_paths:
            if torch_optimizers.read_scalar(registry, path) is None:
                return f"{state_name(path)} is no longer a float"
        return None

    def resolve(self, view):
        """Positions of this program's state in ``view`` (``(used, written)``); None if the
        state it was compiled for does not fit the view any more (``mismatch``). Cached per
        view."""
        resolved = self._memo.get("resolved")
        if resolved is not None and resolved[0] is view:
            return resolved[1]
        if self.mismatch(view) is not None:
            return None
        positions = (
            [view.index_of[p] for p in self.used_paths],
            [view.index_of[p] for p in self.written_paths],
        )
        self._memo["resolved"] = (view, positions)
        return positions

    def mismatch(self, view) -> str | None:
        """Why this program cannot run on the state of ``view``, or None if it can: state it
        uses is gone, changed shape or dtype, is no longer the tensor its optimizer updates
        (a parameter replaced), or is tied differently."""
        known = self._memo.get("mismatch")
        if known is not None and known[0] is view:
            return known[1]
        reason = self._find_mismatch(view)
        self._memo["mismatch"] = (view, reason)
        return reason

    def _find_mismatch(self, view) -> str | None:
        for path in self.used_paths + self.written_paths:
            index = view.index_of.get(path)
            if index is None:
                return f"state {state_name(path)} is gone or now shares a tensor"
            if view.aval(index) != self.state_avals[path]:
                return f"state {state_name(path)} changed shape or dtype"
        current = view.optimizer_params[: len(self.optimizer_params)]
        for o, (then, now) in enumerate(zip(self.optimizer_params, current)):
            if then != now:
                return (
                    f"the parameters optimizer {o} updates are no longer the model's "
                    "(a parameter was replaced: the optimizer keeps the old tensor, as "
                    "in eager torch)"
                    if len(then) == len(now)
                    else f"optimizer {o} has another number of param groups"
                )
        for slot, named in self.ties.items():
            if view.named_by.get(slot) != named:
                return f"state {state_name(slot)} was replaced or tied/untied differently"
        return None


# ---------------------------------------------------------------------------------- table
class ProgramTable:
    """The compiled programs of one traced step, filed by signature; least recently used
    signature first, and under one signature in the order they were compiled."""

    def __init__(self, step_fn):
        self.step_fn = step_fn
        self._entries: collections.OrderedDict = collections.OrderedDict()  # sig -> [entry]
        self.last_signature: ProgramSignature | None = None  # of the entry that served last
        self._warned_evicted = False
        # Learned from captures (``learn``): a frozen parameter's held gradient is set to
        # None by the step before any optimizer reads it, so whether one is held selects
        # nothing; the torch optimizer floats whose exact value the step's Python code
        # depends on (``step_capture.Respecialize``) are traced as constants.
        self._held_gradients_unread = False
        self._constant_scalars: set = set()

    def __bool__(self) -> bool:
        return bool(self._entries)

    @property
    def programs(self) -> list:
        return [entry.program for entries in self._entries.values() for entry in entries]

    @property
    def constant_scalars(self) -> frozenset:
        """Paths of the torch optimizer floats this step's captures trace as constants."""
        return frozenset(self._constant_scalars)

    def learn(self, *, held_gradients_unread: bool = False, constant_scalars=()) -> None:
        """What a capture found out about the step (see ``__init__``), for its later
        signatures and captures."""
        self._held_gradients_unread |= held_gradients_unread
        self._constant_scalars.update(constant_scalars)

    def signature(self, call: StepCall) -> ProgramSignature:
        """The signature of ``call`` (``signature``), as this step's programs are filed."""
        found = signature(call)
        if self._held_gradients_unread and any(found.gradients_held):
            found = found._replace(gradients_held=(False,) * len(found.gradients_held))
        return found

    def lookup(self, call: StepCall):
        """The entry that serves ``call`` on its state with the optimizers' current
        hyperparameters (it becomes the most recently used), or None."""
        signature = self.signature(call)
        registry, current = call.backend.registry, None
        for entry in self._entries.get(signature, ()):
            if entry.resolve(call.view) is None:
                continue
            current = hyperparameters(registry) if current is None else current
            if entry.hyperparameter_mismatch(current, registry) is None:
                self._entries.move_to_end(signature)
                self.last_signature = signature
                return entry
        return None

    def announce_recompile(self, call: StepCall) -> None:
        """Before compiling a program for ``call`` while others exist: warns with what
        changed since the last call, or raises on CSX (a wafer cannot recompile)."""
        if not self._entries:
            return
        signature = self.signature(call)
        registry = call.backend.registry
        current = hyperparameters(registry)
        reasons = (
            entry.mismatch(call.view) or entry.hyperparameter_mismatch(current, registry)
            for entry in self._entries.get(signature, ())
        )
        changed = describe_change(
            self.last_signature, signature, self.step_fn, next((r for r in reasons if r), None)
        )
        name = self.step_fn.__name__
        if call.backend.is_csx:
            raise jax_backend.RecompilationError(
                f"The step function {name!r} was called with a new "
                f"signature ({changed}) after it was compiled. The CSX backend cannot "
                "recompile a running program: keep input shapes, dtypes, the "
                "train/eval mode, requires_grad flags, hooks and the model's parameter "
                "objects as they were when it was compiled (e.g. use drop_last=True in "
                "your DataLoader; freeze layers and register hooks before the first "
                "step), or use a separate @cstorch.trace function for each signature."
            )
        warn(
            f"Compiling {name!r} again because its signature changed "
            f"({changed}). Each new signature costs a trace and a compilation.",
            RecompilationWarning,
        )

    def file(self, call: StepCall, entry) -> None:
        """Files a new ``entry`` under the signature of ``call`` as its capture left it: the
        step body may change what selects a program, e.g. register a gradient hook on a
        parameter in a forward hook (as sparsity does, again in every capture), and the next
        call must find this program, not capture again. It served last."""
        signature = self.signature(call)
        self._entries.setdefault(signature, []).append(entry)
        self.last_signature = signature
        self._evict()

    def forget(self, entry) -> None:
        """Forgets ``entry`` wherever it is filed (nothing if it is not)."""
        for signature, entries in list(self._entries.items()):
            if entry in entries:
                entries.remove(entry)
                if not entries:
                    del self._entries[signature]

    def _evict(self) -> None:
        """Keeps at most MAX_PROGRAMS programs (each holds megabytes of compiled code): a
        step fed ever-changing shapes would otherwise grow without bound."""
        limit = MAX_PROGRAMS.value
        while sum(len(entries) for entries in self._entries.values()) > limit:
            oldest = next(iter(self._entries))
            self._entries[oldest].pop(0)
            if not self._entries[oldest]:
                del self._entries[oldest]
            if not self._warned_evicted:
                self._warned_evicted = True
                warn(
                    f"{self.step_fn.__name__!r} has been compiled for more than {limit} "
                    "signatures; the least recently used programs are dropped and will be "
                    "compiled again if needed. Keep input shapes fixed (e.g. drop_last=True, "
                    "padding to a few bucket sizes) to avoid recompiling.",
                    RecompilationWarning,
                )

    def latest(self) -> ProgramEntry:
        """The program that served the last call (for introspection)."""
        if not self._entries:
            raise CstorchRuntimeError(
                f"{self.step_fn.__name__!r} has not been compiled yet; call it once first."
            )
        return self._entries[self.last_signature][-1].next_program()
