"""The program table of a traced step: which compiled program serves a call.

A traced step keeps one program per *signature* (``ProgramSignature``: the inputs' structure,
shapes and dtypes, the modules' train/eval modes, grad mode, precision policy, parameters'
``requires_grad`` and hooks) and, under one signature, one per state layout (the state a
program uses must still fit: ``CompiledStep.resolve``) and per set of Python-number
hyperparameters. ``ProgramTable`` alone decides: it finds a program for a call, files new
ones (and refiles them when the capture itself changed the signature), forgets and evicts
them (``cstorch.config``: max_programs), and says why a call needs a new one (the
recompile reason of ``RecompilationWarning``).

The persistent graph cache (``cstorch.core.capture_cache``) keys its entries by
``persistent_signature``, a rendering of every field of the same signature as plain data,
so that what selects a program in memory and what selects a graph on disk cannot drift
apart (``tests/cstorch/test_programs.py`` fails for a field without a rendering).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import warnings
from typing import NamedTuple

import torch
from torch.utils import _pytree as pytree

import jax_backend
from jax_backend import Program, scalars
from jax_backend.user_frames import warn
from cstorch import config
from cstorch.core import torch_optimizers
from cstorch.core.state_names import state_name

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


def signature(leaves, spec, impl, view) -> ProgramSignature:
    """The signature of a call with these flattened arguments, now."""
    tensors = tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else None
                    for x in leaves)
    modes, module_hooks = impl.module_modes_and_hooks()
    requires_grad, parameter_hooks, held = impl.parameter_autograd(view)
    return ProgramSignature(spec, tensors, modes, torch.is_grad_enabled(),
                            impl.precision_policy(), requires_grad, parameter_hooks,
                            module_hooks, held)


def _nested_lists(value):
    return [_nested_lists(v) for v in value] if isinstance(value, tuple) else value


def _inputs(shapes_dtypes) -> list:
    return [None if x is None else [list(x[0]), str(x[1])] for x in shapes_dtypes]


def _hooks_by_rank(hooks) -> list:
    """Hook entries (positions, then tuples of ``RemovableHandle`` ids) with each id replaced
    by its rank among the entries' ids: ids count every handle the process ever made, so the
    same hooks registered after another history must render alike (as the fingerprint's
    hook tables do)."""
    ids = sorted({h for entry in hooks for part in entry if isinstance(part, tuple)
                  for h in part})
    rank = {h: i for i, h in enumerate(ids)}
    return [[[rank[h] for h in part] if isinstance(part, tuple) else part for part in entry]
            for entry in hooks]


#: field -> its persistent rendering (plain data, the same in every process).
_RENDERINGS = {
    "input_structure": repr,
    "input_shapes_dtypes": _inputs,
    "train_eval_modes": _nested_lists,
    "grad_mode": bool,
    "precision_policy": repr,
    "requires_grad": list,
    "parameter_hooks": _hooks_by_rank,
    "module_hooks": _hooks_by_rank,
    "gradients_held": list,
}


def persistent_signature(key: ProgramSignature) -> dict:
    """Every field of ``key`` as plain data (JSON), for the persistent graph cache's key."""
    missing = [field for field in ProgramSignature._fields if field not in _RENDERINGS]
    if missing:
        raise TypeError(f"ProgramSignature fields without a persistent rendering: {missing}; "
                        "add one to cstorch.core.programs._RENDERINGS.")
    return {field: _RENDERINGS[field](value) for field, value in zip(key._fields, key)}


# ------------------------------------------------------------------------ recompile reasons
_FIELD_NAMES = {"input_shapes_dtypes": "input shapes/dtypes",
                "train_eval_modes": "train/eval mode",
                "requires_grad": "requires_grad of a parameter (e.g. a layer frozen with "
                                 "requires_grad_(False))",
                "parameter_hooks": "hooks on parameters (register_hook)",
                "module_hooks": "module hooks (register_forward_hook and the like)",
                "gradients_held": "which frozen parameters hold a gradient (zero_grad "
                                  "with set_to_none)"}


def describe_change(old: ProgramSignature, new: ProgramSignature, step_fn=None,
                    reason=None) -> str:
    """Why ``new`` needs another program than ``old`` (``reason``: why the programs under
    ``new`` do not fit the state, if any), as the recompile warning says it."""
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
        "a cstorch optimizer's hyperparameter that is a Python number changed, or the state "
        "the step uses changed shape or dtype; schedule a cstorch optimizer's hyperparameters "
        "with a cstorch scheduler (or store them as tensors) to change them without "
        "recompiling")


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


def hyperparameters(impl) -> list:
    """Per registered optimizer, its param-group values as they select a program (see
    ``_frozen``): what a program that steps the optimizer was traced with."""
    return [tuple(tuple((k, _frozen(v, runtime)) for k, v in group.items() if k != "params")
                  for group in optimizer.param_groups)
            for optimizer, runtime in ((o, torch_optimizers.is_torch_optimizer(o))
                                       for o in impl.optimizer_registry)]


# ------------------------------------------------------------------------------ one program
@dataclasses.dataclass
class CompiledStep:
    """One program of a traced step and what it was compiled for."""

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
    cache: object | None = None  # until the first good run: its capture_cache.CaptureCache
    leaves_gradients: bool = False  # computes gradients and does not zero them
    # State born in the step (``born_state``): this program runs once, at the first call,
    # and its last outputs are the born tensors' values; ``steady`` serves later calls.
    born: list = dataclasses.field(default_factory=list)
    steady: "CompiledStep | None" = None
    born_before: dict | None = None  # born_state.snapshot before the capture (to undo it)
    # The torch optimizers' floats the program reads at every call (their paths, in input
    # order) and what it was traced for of some of them: (path, SIGN or VALUE, condition).
    scalar_paths: list = dataclasses.field(default_factory=list)
    scalar_conditions: list = dataclasses.field(default_factory=list)
    # Host calls a traced step made that run at every call instead: torch LR schedulers'
    # step(), as (phase "before" or "after" the program, function, args, kwargs).
    host_calls: list = dataclasses.field(default_factory=list)
    gradients_held: tuple = ()  # per model parameter: whether it holds a gradient after
    stored_attributes: list = dataclasses.field(default_factory=list)  # (module dict, name)
    _resolved: tuple = (None, None, None)  # (view, used indices, written indices)
    _mismatch: tuple = (None, None)  # (view, why this program does not fit it)

    def hyperparameter_mismatch(self, current: list, impl) -> str | None:
        """Why this program cannot serve the optimizers' param groups as they are, or None.
        It serves groups that hold what it was traced with: the same keys, the same
        non-float values (Python numbers that are not a torch optimizer's floats are
        constants of the graph), tensors where there were tensors, and for the floats it
        reads, values that meet its conditions (``jax_backend.scalars``)."""
        for o, values in self.hyperparameters.items():
            if o >= len(current) or current[o] != values:
                return (f"a hyperparameter of optimizer {o} that is a constant of the "
                        "compiled step changed (a cstorch optimizer's number, a torch "
                        "optimizer's flag or int, a tensor set or removed, a param group)")
        for path, kind, traced in self.scalar_conditions:
            value = torch_optimizers.read_scalar(impl, path)
            if value is None or scalars.condition(kind, value) != traced:
                what = "the sign of" if kind == scalars.SIGN else "the value of"
                return (f"{what} {state_name(path)} changed (the step's Python code "
                        "depends on it, e.g. `if weight_decay != 0`)")
        for path in self.scalar_paths:
            if torch_optimizers.read_scalar(impl, path) is None:
                return f"{state_name(path)} is no longer a float"
        return None

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


# ---------------------------------------------------------------------------------- table
class ProgramTable:
    """The compiled programs of one traced step, filed by signature; least recently used
    signature first, and under one signature in the order they were compiled."""

    def __init__(self, step_fn):
        self.step_fn = step_fn
        self._programs: collections.OrderedDict = collections.OrderedDict()  # key -> [entry]
        self.last_key: ProgramSignature | None = None  # of the program that served last
        self._warned_evicted = False
        # Learned from a capture in which a frozen parameter held a gradient: the step sets
        # it to None before any optimizer reads it, so whether one is held selects nothing.
        self.held_gradients_unread = False

    def __bool__(self) -> bool:
        return bool(self._programs)

    def signature(self, leaves, spec, impl, view) -> ProgramSignature:
        """The signature of a call (``signature``), as this step's programs are filed."""
        key = signature(leaves, spec, impl, view)
        if self.held_gradients_unread and any(key.gradients_held):
            key = key._replace(gradients_held=(False,) * len(key.gradients_held))
        return key

    @property
    def programs(self) -> list:
        return [entry.program for entries in self._programs.values() for entry in entries]

    def find(self, key: ProgramSignature, view, impl):
        """``(entry, positions)`` of the program that serves ``key`` on the state of
        ``view`` with the optimizers' current hyperparameters (it becomes the most recently
        used), or None."""
        current = None
        for entry in self._programs.get(key, ()):
            positions = entry.resolve(view)
            if positions is None:
                continue
            current = hyperparameters(impl) if current is None else current
            if entry.hyperparameter_mismatch(current, impl) is None:
                self._programs.move_to_end(key)
                self.last_key = key
                return entry, positions
        return None

    def mismatch(self, key: ProgramSignature, view, impl) -> str | None:
        """Why the programs filed under ``key`` (if any) do not fit the state of ``view`` or
        the optimizers' hyperparameters."""
        current = hyperparameters(impl)
        reasons = [entry.mismatch(view) or entry.hyperparameter_mismatch(current, impl)
                   for entry in self._programs.get(key, ())]
        return next((r for r in reasons if r), None)

    def announce_recompile(self, key: ProgramSignature, reason: str | None,
                           is_csx: bool) -> None:
        """Before compiling a program for ``key`` while others exist: warns with what
        changed since the last call, or raises on CSX (a wafer cannot recompile)."""
        if not self._programs:
            return
        name = self.step_fn.__name__
        changed = describe_change(self.last_key, key, self.step_fn, reason)
        if is_csx:
            raise jax_backend.RecompilationError(
                f"The step function {name!r} was called with a new "
                f"signature ({changed}) after it was compiled. The CSX backend cannot "
                "recompile a running program: keep input shapes, dtypes, the "
                "train/eval mode, requires_grad flags, hooks and the model's parameter "
                "objects as they were when it was compiled (e.g. use drop_last=True in "
                "your DataLoader; freeze layers and register hooks before the first "
                "step), or use a separate @cstorch.trace function for each signature.")
        warn(f"Compiling {name!r} again because its signature changed "
             f"({changed}). Each new signature costs a trace and a compilation.",
             RecompilationWarning)

    def add(self, key: ProgramSignature, entry: CompiledStep) -> None:
        self._programs.setdefault(key, []).append(entry)

    def refile(self, entry: CompiledStep, key: ProgramSignature,
               after: ProgramSignature) -> ProgramSignature:
        """Files a just-captured program under ``after``, the signature as the capture left
        it, and returns that (now the last key). The step body may change what selects a
        program, e.g. register a gradient hook on a parameter in a forward hook (as sparsity
        does, again in every capture): the next call must find this program, not capture
        again."""
        if after != key:
            self._remove(key, entry)
            self.add(after, entry)
        self.last_key = after
        return after

    def discard(self, key: ProgramSignature, entry: CompiledStep) -> None:
        """Forgets ``entry``, filed under ``key``."""
        self._remove(key, entry)

    def forget(self, entry: CompiledStep | None) -> None:
        """Forgets ``entry`` wherever it is filed (nothing if it is not)."""
        for key, entries in list(self._programs.items()):
            if entry in entries:
                self._remove(key, entry)

    def _remove(self, key, entry) -> None:
        self._programs[key].remove(entry)
        if not self._programs[key]:
            del self._programs[key]

    def evict(self) -> None:
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
                warnings.warn(  # attributed as before the table had a module of its own
                    f"{self.step_fn.__name__!r} has been compiled for more than {limit} "
                    "signatures; the least recently used programs are dropped and will be "
                    "compiled again if needed. Keep input shapes fixed (e.g. drop_last=True, "
                    "padding to a few bucket sizes) to avoid recompiling.",
                    RecompilationWarning, stacklevel=4)

    def latest(self) -> CompiledStep:
        """The program that served the last call (for introspection)."""
        if not self._programs:
            raise RuntimeError(
                f"{self.step_fn.__name__!r} has not been compiled yet; call it once first.")
        return self._programs[self.last_key][-1]
