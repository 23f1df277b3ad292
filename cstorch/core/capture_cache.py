"""The persistent graph cache (``jax_backend.graph_cache``) as traced steps use it.

The backend stores and checks entries; this module supplies what only cstorch knows:

* **the key's parts**: every registered model, optimizer, scheduler, grad scaler, metric
  and stateful object (their types, attributes, hooks, param groups, step counters,
  sparsity settings), the step's non-tensor arguments, and the user's step function (each
  of its free variables and globals a part of its own, then its code), fingerprinted with
  the backend itself standing in as an opaque name, plus the backend type, engine and
  layout. cstorch's process-wide state that cstorch code reads where the fingerprint does
  not look (the ``cstorch.backends`` flags, the half dtype, ...) is declared for the key
  where it is defined (``config.include_in_graph_key``) and the engine adds it. The step's
  name for the cache's miss diagnostics is its function's qualified name and file;
* **what selects the program**: the call's ``ProgramSignature`` as
  ``programs.persistent_signature`` renders it, the one definition the program table
  selects programs by (so a new signature field cannot be left out of the key);
* **what ``_compile`` derives from a trace** besides the graph, so a hit can rebuild it:
  each recorded step closure as a path from the step function (one of its free variables or
  globals, by identity, and its code digest) or a registered metric's closure by its public
  name (``metrics.metric.step_closures``), and the step-counter increments as (registry,
  index, increment);
* **when not to cache**: trace hooks or traced-tensor listeners are registered (they must
  see a capture), the job has several processes, the capture issued warnings (a hit would
  not repeat them), the trace changed Python values the key covers (a hit would not repeat
  that either), it opened a file for writing, or anything the fingerprint, the encoding or
  a closure path cannot describe. Files the trace opens for reading become part of the
  entry (``graph_cache.watching_capture``).
  Such a step is captured every time, exactly as without the cache.

An entry is written only after the step's program first ran successfully.
"""

from __future__ import annotations

import contextlib
import json
import types
import warnings

import torch

from cstorch import config
from cstorch.backend import Backend, precision
from cstorch.backend.base_backend import BaseBackend
from cstorch.core.programs import ProgramSignature, persistent_signature
from cstorch.distributed import runtime
from cstorch.experimental import listener
from cstorch.metrics.metric import step_closures as metric_step_closures
from cstorch.utils import step_closures
from jax_backend import graph_cache
from jax_backend.errors import CstorchValueError
from jax_backend.graph_cache import fingerprint
from jax_backend.graph_cache.fingerprint import Fingerprinter, NotCacheable

_NAMED_CODE = step_closures.named(lambda: None).__code__  # the runner every closure gets

# The half dtype and mixed precision, which cstorch code reads while a step is traced:
# declared here until cstorch/backend/precision.py declares it beside its state (the same
# line there; a second declaration of the same function is a no-op).
config.config.include_in_graph_key("cstorch.amp", precision.amp_settings)


def _function(fn):
    fn = fn.__func__ if isinstance(fn, types.MethodType) else fn
    return fn if isinstance(fn, types.FunctionType) else None


def _stand_in(traced_step_type):
    """Names cstorch's own objects for the fingerprint instead of walking them."""

    def stand_in(obj):
        if isinstance(obj, (BaseBackend, Backend)):
            return "cstorch backend"
        if isinstance(obj, types.FunctionType) and getattr(obj, "is_step_closure", False):
            # Runs after the step, with real values: only which function it is matters.
            wrapped = _function(getattr(obj, "__wrapped__", None))
            return (
                "step closure",
                obj.__qualname__,
                fingerprint.code_digest(wrapped.__code__) if wrapped else None,
            )
        if isinstance(obj, traced_step_type):  # a traced step called inside this one
            return ("traced step", obj.step_fn)
        return None

    return stand_in


def _layout(layout) -> str | None:
    if layout is None:
        return None
    return json.dumps(
        [dict(layout.mesh.shape), layout.shard_state, [int(d.id) for d in layout.mesh.devices.flat]]
    )


def _reachable(step_fn) -> list:
    """(kind, name, value) of the step function's free variables and the globals it names."""
    fn = _function(step_fn)
    if fn is None:
        return []
    found = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        with contextlib.suppress(ValueError):  # an unbound cell
            found.append(("freevar", name, cell.cell_contents))
    for name in fingerprint.global_names(fn.__code__):
        if name in fn.__globals__:
            found.append(("global", name, fn.__globals__[name]))
    return found


def _step_name(step_fn) -> str:
    """The step's name in the cache's diagnostics: where a miss finds its stored entries."""
    fn = _function(step_fn)
    if fn is None:
        return f"a {type(step_fn).__module__}.{type(step_fn).__qualname__}"
    return f"{fn.__qualname__} in {fn.__code__.co_filename}"


def _same_method(a, b) -> bool:
    return (
        isinstance(a, types.MethodType)
        and isinstance(b, types.MethodType)
        and a.__self__ is b.__self__
        and a.__func__ is b.__func__
    )


def _parameter_hook_functions(view) -> list:
    """``[index, register_hook functions, post-accumulate functions]`` per model parameter
    with hooks, as they are when the key is taken. The signature names these hooks by
    position and handle only, and a parameter is state, which the fingerprint names by its
    place without walking it: without this a hook replaced by another would find the old
    graph. (A snapshot: hooks the capture itself registers, as sparsity does, are the
    graph's own.)"""
    hooks = []
    with torch._C.DisableTorchFunctionSubclass():  # no state guard: nothing is read
        for i, p in enumerate(view.parameters):
            before, after = p._backward_hooks, p._post_accumulate_grad_hooks
            if before or after:
                hooks.append([i, list((before or {}).values()), list((after or {}).values())])
    return hooks


def _context_not_cacheable(trace_hooks: bool) -> str | None:
    if trace_hooks:
        return "trace hooks are registered"
    if listener.has_hooks():
        return "traced-tensor hooks are registered"
    if runtime.process_count() > 1:
        return "the job has several processes"
    return None


class CaptureCache:
    """The cache's view of one compilation of a traced step: ``load`` on the way in, then
    ``prepare`` after a capture and ``store`` after the program's first good run."""

    def __init__(
        self,
        impl,
        step_fn,
        leaves,
        key: ProgramSignature,
        view,
        inputs,
        decompositions,
        *,
        traced_step_type: type,
        trace_hooks: bool,
        lookup: bool = True,
    ):
        self.impl, self.step_fn, self.view = impl, step_fn, view
        self.key = None  # the entry's name (``StepKey.digest``); None: not cached
        self._step_key = None
        self.hit = False  # whether ``load`` found the graph
        self._pending = None
        self._lookup = lookup  # False: capture (and store) even if an entry exists
        self._files_read = None  # the capture's graph_cache.CaptureRecord
        self.directory = graph_cache.default_directory()
        if self.directory is None:
            return
        # The registered objects first: the step function reaches them too, and an object
        # is described in the first part that meets it (a miss names that part).
        self._roots = [
            ("models", impl.models),
            ("optimizers", impl.optimizer_registry),
            ("schedulers", impl.schedulers),
            ("grad scalers", impl.grad_scalers),
            ("metrics", impl.metrics),
            ("stateful objects", impl.stateful_objects),
            ("sparsity", impl.sparsity_registry),
            ("parameter hooks", _parameter_hook_functions(view)),
            ("arguments", [None if isinstance(x, torch.Tensor) else x for x in leaves]),
        ]
        self._key_args = (inputs, decompositions, _stand_in(traced_step_type))
        why = _context_not_cacheable(trace_hooks)
        with self._guarded():
            if why is not None:
                raise NotCacheable(why)
            # What selects the program in memory selects its graph on disk: the same
            # signature, rendered field by field (programs.persistent_signature).
            self._selection = persistent_signature(key)
            self._extra = {
                "backend type": str(impl.backend_type),
                "engine": impl.engine,
                "CSX": impl.is_csx,
                "device layout": _layout(impl.layout),
            }
            self._step_key, self.files, self._before = self._compute_key()
            self.key = self._step_key.digest

    @contextlib.contextmanager
    def _guarded(self):
        """The cache must never stop a step: what it cannot describe makes the step not
        cacheable (``graph_cache.report``: a debug message, a warning with the diagnostics
        on); an unexpected error does too, with a warning."""
        try:
            yield
        except NotCacheable as err:
            self._give_up(str(err))
        except Exception as err:  # noqa: BLE001 - see the docstring
            warnings.warn(
                f"The graph cache failed ({type(err).__name__}: {err}); "
                f"{getattr(self.step_fn, '__name__', 'the step')!r} is captured "
                "without it.",
                graph_cache.GraphCacheWarning,
                stacklevel=4,
            )
            self._give_up(repr(err))

    def _compute_key(self, consumable=None):
        """``(StepKey, files, fingerprinter)``; the process-wide values are read now (before
        and after a trace)."""
        inputs, decompositions, stand_in = self._key_args
        fp = Fingerprinter(self.view.tensors, hook=stand_in, consumable=consumable)
        for label, root in self._roots:
            fp.add(label, root)
        fp.add_function("step function", self.step_fn)
        key = graph_cache.step_key(
            fp,
            self.view.slots,
            inputs,
            self._selection,
            decompositions,
            self._extra,
            step=_step_name(self.step_fn),
        )
        fp.release()
        return key, sorted(fp.files), fp

    def _give_up(self, reason: str) -> None:
        graph_cache.report("graph cache: %s is not cached: %s", _step_name(self.step_fn), reason)
        self.key = None

    # -------------------------------------------------------------------------------- hit
    def load(self):
        """``(captured, closures, counter_steps, traced)`` from the cache, or None;
        ``traced`` as ``prepare`` was given it."""
        hit = None
        with self._guarded():
            if self.key is not None and self._lookup:
                hit = self._load()
        return hit

    def _load(self):
        entry = graph_cache.load(
            self.directory, self._step_key, self.view.tensors, self._key_args[0], self.files
        )
        if entry is None:
            return None
        try:
            extras = entry.extras
            closures = [self._resolve_closure(c) for c in extras["closures"]]
            counters = [self._resolve_counter(c) for c in extras["counters"]]
            consumed = [self._resolve_generator(path) for path in extras["consumed"]]
            traced = self._resolve_traced(extras["traced"])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            warnings.warn(
                f"Ignoring graph cache entry {self.key} (its step closures or "
                f"counters do not resolve: {err}); the step is captured again.",
                graph_cache.GraphCacheWarning,
                stacklevel=4,
            )
            return None
        for generator in consumed:  # as the trace would have
            for _ in generator:
                pass
        self.hit = True
        return entry.captured, closures, counters, traced

    def discard(self) -> None:
        """Removes the entry a hit came from (its program failed to build or run)."""
        if self.hit:
            graph_cache.discard(self.directory, self.key)

    def _find(self, where, name):
        for kind_found, name_found, value in _reachable(self.step_fn):
            if (kind_found, name_found) == (where, name):
                return value
        raise CstorchValueError(f"no {where} {name!r}")

    def _resolve_generator(self, path):
        where, name = path
        generator = self._find(where, name)
        if (
            not isinstance(generator, types.GeneratorType)
            or id(generator) not in self._before.generators
        ):
            raise CstorchValueError(f"{name!r} is not an unstarted generator")
        return generator

    def _resolve_closure(self, record):
        kind = record["kind"]
        if kind not in ("step", "checkpoint"):
            raise CstorchValueError(f"closure kind {kind!r}")
        if "metric" in record:
            return kind, metric_step_closures(self.impl.metrics[record["metric"]])[
                record["closure"]
            ]
        where, name, unwrap = record["path"]
        fn = self._find(where, name)
        fn = fn.__wrapped__ if unwrap else fn
        if fingerprint.code_digest(_function(fn).__code__) != record["code"]:
            raise CstorchValueError(f"{name!r} has other code")
        return kind, step_closures.named(fn) if record["named"] else fn

    def _resolve_traced(self, record) -> dict:
        """``prepare``'s ``traced`` from its description (``_describe_traced``)."""
        stepped = record["stepped"]
        if not all(type(i) is int and 0 <= i < len(self.impl.optimizer_registry) for i in stepped):
            raise CstorchValueError("a malformed optimizer index")
        calls = []
        for phase, path, args in record["host_calls"]:
            if phase not in ("before", "after") or not isinstance(args, list):
                raise CstorchValueError("a malformed scheduler step")
            calls.append((phase, self._find(*path), tuple(args), {}))
        constants = [
            tuple(tuple(p) if isinstance(p, list) else p for p in path)
            for path in record["constant_paths"]
        ]
        held, stored = record["gradients_held"], record["stored"]
        if not all(type(h) is bool for h in held):
            raise CstorchValueError("malformed gradient flags")
        for m, name, attribute in stored:  # each must name a module of a registered model
            self.impl.models[m].get_submodule(name)
            if not isinstance(attribute, str):
                raise CstorchValueError("a malformed attribute name")
        return {
            "stepped": stepped,
            "host_calls": calls,
            "constant_paths": set(constants),
            "gradients_held": held,
            "stored": stored,
        }

    def _describe_traced(self, traced: dict) -> dict:
        calls = []
        for phase, scheduler, args, kwargs in traced["host_calls"]:
            if kwargs or not all(type(a) in (int, float, bool, type(None)) for a in args):
                raise NotCacheable("a scheduler step with arguments other than numbers")
            calls.append(
                [phase, self._path_of(scheduler, "an LR scheduler the step steps"), list(args)]
            )
        return {
            "stepped": traced["stepped"],
            "host_calls": calls,
            "constant_paths": [list(p) for p in traced["constant_paths"]],
            "gradients_held": traced["gradients_held"],
            "stored": traced["stored"],
        }

    def _resolve_counter(self, record):
        registry, index, increment = record
        objects = {"optimizer": self.impl.optimizer_registry, "scheduler": self.impl.schedulers}[
            registry
        ]
        if type(index) is not int or type(increment) is not int or increment < 0:
            raise CstorchValueError("a malformed counter")
        return objects[index], increment

    # ------------------------------------------------------------------------------- miss
    @contextlib.contextmanager
    def watching(self):
        """Around a capture: warnings it issues are shown as usual, and make it not
        cacheable (a hit would not issue them again); the files it opens are recorded
        (their contents become part of the entry)."""
        if self.key is None:
            yield
            return
        caught = []
        try:
            with (
                warnings.catch_warnings(record=True) as caught,
                graph_cache.watching_capture() as self._files_read,
            ):
                yield
        finally:
            for message in caught:  # shown where they would have been, once recording ended
                warnings._showwarnmsg(message)
        if caught:
            self._give_up(
                f"the capture issued {caught[0].category.__name__}: {str(caught[0].message)[:100]}"
            )
        elif self._files_read.problem:
            self._give_up(self._files_read.problem)

    def prepare(self, captured, records, counter_steps, traced: dict) -> None:
        """After a capture: checks the trace left the fingerprinted Python values as they
        were, and describes its closures, counters and what else it ``traced`` (the
        optimizers it stepped, the scheduler steps it defers, the torch optimizer floats it
        took as constants) for a later hit."""
        if self.key is None:
            return
        with self._guarded():
            key, files, after = self._compute_key(consumable=self._before.generators)
            extras = {
                "closures": [self._describe_closure(r) for r in records],
                "counters": [self._describe_counter(obj, n) for obj, n in counter_steps],
                "consumed": [
                    self._path_of(g, "a generator the trace consumed") for g in after.consumed
                ],
                "traced": self._describe_traced(traced),
            }
            if key != self._step_key:
                changed = ", ".join(key.differences(self._step_key.parts))
                raise NotCacheable(
                    f"the step changed values it reads while it was traced (in {changed}: an "
                    "attribute, a global, a closure variable, a setting); a cached graph "
                    "would not"
                )
            read = sorted(self._files_read.read) if self._files_read is not None else []
            self._pending = (captured, extras, files, read)

    def _describe_closure(self, record) -> dict:
        fn, named = record.fn, False
        if getattr(fn, "__code__", None) is _NAMED_CODE:
            fn, named = fn.__wrapped__, True
        for i, metric in enumerate(self.impl.metrics):
            for name, closure in metric_step_closures(metric).items():
                if _same_method(fn, closure):
                    return {"kind": record.kind, "metric": i, "closure": name}
        code = _function(fn)
        for where, name, value in _reachable(self.step_fn):
            for unwrap, candidate in ((False, value), (True, getattr(value, "__wrapped__", None))):
                if candidate is fn and code is not None:
                    return {
                        "kind": record.kind,
                        "path": [where, name, unwrap],
                        "named": named,
                        "code": fingerprint.code_digest(code.__code__),
                    }
        raise NotCacheable(
            f"the step closure {getattr(fn, '__name__', fn)!r} is not a free "
            "variable or global of the step function"
        )

    def _path_of(self, obj, what) -> list:
        for where, name, value in _reachable(self.step_fn):
            if value is obj:
                return [where, name]
        raise NotCacheable(f"{what} is not a free variable or global of the step function")

    def _describe_counter(self, obj, increment) -> list:
        for registry, objects in (
            ("optimizer", self.impl.optimizer_registry),
            ("scheduler", self.impl.schedulers),
        ):
            for i, candidate in enumerate(objects):
                if candidate is obj:
                    return [registry, i, increment]
        raise NotCacheable(f"a step counter of an unregistered {type(obj).__name__}")

    def store(self) -> None:
        """Writes the prepared entry (once)."""
        pending, self._pending = self._pending, None
        if pending is None or self.key is None:
            return
        with self._guarded():
            captured, extras, files, read = pending
            graph_cache.store(self.directory, self._step_key, captured, extras, files, read)
