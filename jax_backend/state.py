"""Device-resident state: the JAX arrays that hold torch state tensors between steps.

After a compiled step the newest value of a parameter, buffer or optimizer-state tensor lives
in a JAX array; the torch tensor keeps its last synchronised value (large ones keep nothing,
see below) until someone asks for it.
Eager torch semantics still hold for the torch objects:

* Each state tensor is *guarded* (``jax_backend.state_guard``: its class becomes
  ``GuardedParameter`` / ``GuardedTensor``, same identity): the first torch operation that
  reads or edits it copies the newest value in first, so ``print(p)``, ``p.add_(x)`` or
  ``p.clamp_(-c, c)`` between steps see the newest value.
* An edit on the torch side is noticed before the next step and uploaded: by the tensor's
  version counter (in-place ops, ``load_state_dict``), by its storage (``p.data = t``), and
  by its memory having been handed out through the guard (a view, ``p.data``, a numpy
  array: edits through those bump no counter of the tensor).
* Memory that something reaches without passing the guard (``shared_memory``: an alias
  taken before the tensor was guarded or still alive, the numpy array a tensor was made from)
  makes the tensor *shared*: torch is its source of truth. Each step's new value is written
  into it before the step returns (waiting for the step; a ``SharedStateWarning`` names it
  once), and it is uploaded again before every step. Other tensors pay nothing for this:
  whether a tensor is shared is found out when it is uploaded, and new aliases can only be
  made through the guard.
* A value that cannot be read back (its step failed) is dropped, with an error, instead of
  poisoning every later read.

Between synchronisations the torch side keeps no second copy of large state: once the array
holds a tensor's value, the tensor's storage is *released* (resized to 0 bytes; shape, dtype,
identity and version stay) and the guard re-allocates and fills it on the next torch access.
Only tensors that nothing else can reach are released (``_sole_owner``, never a shared one):
storage shared with a view, a ``p.data`` alias, a numpy array or a held storage object is
kept, since those read it without passing the guard. A released tensor always has an entry
here, so every path that drops an entry gives the storage back first (``_fill``), and a value
that is lost (its step failed and no copy is left) becomes NaN, never a dangling storage.
Releasing and filling are ordered so that an interrupt between any two of their operations
leaves a tensor the next access fills from its array.

Each tensor's entry is a small state machine: its flags change only through
``_Entry.transition``, and ``TRANSITIONS`` lists every legal change (checked under the
``debug_state`` setting, ``CSTORCH_DEBUG_STATE=1``).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import torch
from torch.utils.weak import WeakIdKeyDictionary

from jax_backend import config, host_memory, shared_memory
from jax_backend.dtypes import array_to_numpy, copy_into, state_to_host, tensor_to_array
from jax_backend.errors import CstorchError, StepFailedError, raise_interrupt_behind
from jax_backend.jax_settings import thread_settings_kept
from jax_backend.state_guard import guard, guarded_by, no_guard, unguard
from jax_backend.user_frames import warn


class SharedStateError(CstorchError, RuntimeError):
    """A state tensor's memory is shared with an alias that cannot be kept current."""


class SharedStateWarning(UserWarning):
    """A state tensor's memory is shared with an alias, so each step's value is written
    into it right away (which waits for the step)."""


class IllegalTransition(CstorchError, AssertionError):
    """An entry's flags changed in a way ``TRANSITIONS`` does not allow (``debug_state``):
    a bug in the engine, not in the user's code."""


def _storage_key(tensor: torch.Tensor):
    """Where the tensor's data lives: changes when ``p.data = t`` rebinds it."""
    return tensor.data_ptr(), tensor.shape


def _sole_owner(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is the only thing holding its storage, and covers all of it: then
    releasing the storage cannot pull memory from under anyone who reads it unguarded."""
    storage = tensor.untyped_storage()
    if (
        tensor._is_view()
        or tensor.storage_offset() != 0
        or not tensor.is_contiguous()
        or storage.nbytes() != tensor.numel() * tensor.element_size()
    ):
        return False
    return not shared_memory.shared_elsewhere(tensor)


def _count_edit(tensor: torch.Tensor) -> int:
    """Bumps the version counter as an in-place edit would, and returns it. A step's update
    is one (so autograd refuses a backward through a graph that saved the old value, as in
    eager torch), and so is a release: that graph would read freed memory."""
    if not tensor.is_inference():
        torch.autograd.graph.increment_version(tensor)
    return tensor._version


# ------------------------------------------------------------------ an entry's states
# A state names where a tensor's newest value is, and who can reach its torch memory:
#   synced     torch and the array hold the same value
#   stale      the array is newer; torch keeps its last synchronised value
#   released   the array is newer; torch's storage is given back (0 bytes)
# followed by its reach: nothing (only through the guard), "+lent" (its memory was handed
# out through the guard since the upload: maybe edited unseen), or "+shared" (something
# reaches it unguarded: torch is the source of truth). "absent": no entry (before the upload,
# after the entry left). A "*" in a row below stands for the same reach on both sides.
_TABLE = (
    # from          event            to
    ("absent", "upload", "synced"),  # the torch value copied to an array
    ("absent", "upload", "synced+shared"),  # ... its memory reachable unguarded
    ("synced*", "step-result", "stale*"),  # a step wrote the tensor's new array
    ("stale*", "step-result", "stale*"),
    ("released*", "step-result", "released*"),
    ("stale+lent", "share", "stale+shared"),  # what was handed out is still held
    ("synced", "hand-out", "synced+lent"),  # a torch op returned its memory
    ("synced+lent", "hand-out", "synced+lent"),
    ("synced+shared", "hand-out", "synced+shared"),
    ("synced", "release", "released"),  # torch's copy given back
    ("stale", "release", "released"),
    ("stale+lent", "release", "released+lent"),  # (the alias is gone by then)
    ("released*", "keep", "stale*"),  # torch refused: the storage stays
    ("released*", "freed", "released*"),  # version and storage noted
    ("stale*", "fill", "synced*"),  # the array copied into torch (for a
    ("released*", "fill", "synced*"),  # shared tensor: its write-through)
    ("synced*", "drop", "absent"),  # left the state with its newest value
    ("synced*", "rollback", "absent"),  # left with its last synchronised
    ("stale*", "rollback", "absent"),  # value (failed step, split value)
    ("released*", "lose", "absent"),  # no value left: set to NaN
)
_REACHES = ("", "+lent", "+shared")
_STATES = (
    "absent",
    *(
        f"{value}{reach}"
        for value in ("synced", "stale", "released")
        for reach in _REACHES
        if (value, reach) != ("released", "+shared")
    ),
)


def _expand(table) -> frozenset:
    """The rows of ``table`` with each ``*`` replaced by every reach (where both states exist)."""
    rows = set()
    for before, event, after in table:
        if not before.endswith("*"):
            rows.add((before, event, after))
            continue
        for reach in _REACHES:
            row = (before[:-1] + reach, event, after if after == "absent" else after[:-1] + reach)
            if row[0] in _STATES and row[2] in _STATES:
                rows.add(row)
    return frozenset(rows)


TRANSITIONS = _expand(_TABLE)  # every legal (from state, event, to state)

# What each event sets; the values it comes with (a new array, the version and storage noted
# at a synchronisation, what an upload found out) are passed to ``transition``.
_EFFECTS = {
    event: tuple(effect.items())
    for event, effect in {
        "upload": {"live": True, "array_is_newer": False, "released": False, "handed_out": False},
        "step-result": {"array_is_newer": True},
        "share": {"shared": True},
        "hand-out": {"handed_out": True},
        "release": {"array_is_newer": True, "released": True},
        "keep": {"released": False},
        "freed": {},
        "fill": {"array_is_newer": False, "released": False},
        "drop": {"live": False},
        "rollback": {"live": False},
        "lose": {"live": False, "released": False},
    }.items()
}
_VALUE = {(False, False): "synced", (True, False): "stale", (True, True): "released"}
_SAME = object()  # a value ``transition`` leaves as it is


@dataclasses.dataclass(eq=False)
class _Entry:
    """What a ``DeviceState`` knows of one state tensor. Its flags change only through
    ``transition`` (the table above)."""

    tensor: torch.Tensor
    array: jax.Array | None = None
    synced_version: int | None = None  # the tensor's version at the last synchronisation
    storage: tuple | None = None  # _storage_key at the last synchronisation
    live: bool = False  # in its DeviceState (from the upload until it leaves)
    array_is_newer: bool = False
    # Since the last upload a torch access handed out its memory (a view, ``p.data``, a
    # numpy array): edits through that bump no counter of the tensor.
    handed_out: bool = False
    # At the last upload something else could reach its memory (``shared_memory``): torch is
    # the source of truth, written after every step and uploaded before every step.
    shared: bool = False
    foreign: bool = False  # its memory may be a numpy array someone else holds
    released: bool = False  # the torch storage was given back; the array is the only copy
    # Under ``debug_state``: the DeviceState (weakly), which names the tensor in an error.
    checked_by: weakref.ref | None = None

    def transition(
        self,
        event: str,
        array=_SAME,
        synced_version=_SAME,
        storage=_SAME,
        shared=_SAME,
        foreign=_SAME,
    ) -> None:
        """Applies ``event``: its effect on the flags (``_EFFECTS``) and the values that come
        with it; under ``debug_state`` raises ``IllegalTransition``, leaving the entry as it
        was, unless the change is in ``TRANSITIONS``. (Named arguments, not ``**values``:
        this runs for every state tensor on every step.)"""
        if self.checked_by is not None:
            before, flags = self.state(), dict(self.__dict__)
        for name, value in _EFFECTS[event]:
            setattr(self, name, value)
        if array is not _SAME:
            self.array = array
        if synced_version is not _SAME:
            self.synced_version = synced_version
        if storage is not _SAME:
            self.storage = storage
        if shared is not _SAME:
            self.shared = shared
        if foreign is not _SAME:
            self.foreign = foreign
        if self.checked_by is not None:
            after = self.state()
            if (before, event, after) not in TRANSITIONS:
                self.__dict__.update(flags)
                self._illegal(before, event, after)

    def state(self) -> str:
        """The entry's state as ``TRANSITIONS`` names it (a name outside ``_STATES`` for a
        combination of flags that should never occur)."""
        if not self.live:
            return "absent"
        value = _VALUE.get((self.array_is_newer, self.released), "released-but-not-newer")
        if self.shared:
            return value + "+shared"
        if self.foreign:
            return value + "+foreign-but-not-shared"
        return value + "+lent" if self.handed_out else value

    def _illegal(self, before: str, event: str, after: str):
        owner = self.checked_by() if self.checked_by is not None else None
        name = (
            owner._describe(self.tensor)
            if owner is not None and self.tensor is not None
            else "(gone)"
        )
        legal = sorted({e for b, e, _ in TRANSITIONS if b == before})
        raise IllegalTransition(
            f"DeviceState entry of state tensor {name}: event {event!r} is not legal from "
            f"state {before!r} (it would leave it {after!r}); legal events from {before!r}: "
            f"{', '.join(legal) or 'none'}. The transitions are listed in "
            "jax_backend/state.py (TRANSITIONS)."
        )

    def torch_side_changed(self) -> bool:
        if self.released:  # nothing touches it unguarded, and the guard fills it first
            return False
        return (
            self.handed_out
            or self.shared
            or self.tensor._version != self.synced_version
            or _storage_key(self.tensor) != self.storage
        )


class DeviceState:
    """Maps torch state tensors (by identity) to their JAX arrays."""

    # Smaller tensors keep their storage: the memory saved would not pay for re-allocating it
    # on every access (scalars such as a scheduled lr are read between most steps).
    release_min_bytes = 1 << 16

    def __init__(self, device=None, layout=None):
        self.device = device
        self.layout = layout  # a mesh.Layout: where state arrays are placed (None: one device)
        self._entries: dict[int, _Entry] = {}
        self._pending = False  # some array is newer than its tensor
        # How warnings name a state tensor (the backend knows its path); None: by shape.
        self.name_of: Callable[[torch.Tensor], str | None] | None = None
        self._warned_shared = WeakIdKeyDictionary()  # tensors named in a SharedStateWarning
        # Under ``debug_state`` every entry checks its transitions (``TRANSITIONS``).
        self.checks_transitions = bool(config.debug_state.value)

    def __len__(self):
        return len(self._entries)

    def __contains__(self, tensor):
        return id(tensor) in self._entries

    def _upload(self, tensor: torch.Tensor) -> _Entry:
        """Copies the torch value into a new array. Caller: under ``no_guard``."""
        previous = self._entries.get(id(tensor))
        if previous is not None and previous.tensor is tensor and previous.array_is_newer:
            self.materialize([tensor])  # never upload a torch value older than the array
        if self.layout is not None:
            array = self.layout.place_state(state_to_host(tensor))
        else:
            array = tensor_to_array(tensor, self.device)
        entry = self._new_entry(tensor, array, previous)
        self._entries[id(tensor)] = entry
        if previous is not None and previous.tensor is tensor:
            previous.transition("drop")
        return entry

    def _new_entry(self, tensor: torch.Tensor, array, previous: _Entry | None) -> _Entry:
        """An entry for ``tensor``, whose torch value ``array`` holds. The tensor is guarded
        from here on, so a new alias of its memory passes through the guard; whether its
        memory is reachable already is found out now (module docstring)."""
        key = _storage_key(tensor)
        if previous is not None and previous.tensor is tensor and previous.storage == key:
            foreign = previous.foreign  # same memory: what was known of it still holds
        else:
            foreign = shared_memory.may_be_foreign(tensor)
        version = tensor._version
        guard(tensor, self)
        shared = foreign or not guarded_by(tensor, self) or shared_memory.shared_elsewhere(tensor)
        entry = _Entry(tensor, checked_by=weakref.ref(self) if self.checks_transitions else None)
        entry.transition(
            "upload",
            array=array,
            synced_version=version,
            storage=key,
            foreign=foreign,
            shared=shared,
        )
        return entry

    def arrays(self, tensors: Sequence[torch.Tensor]) -> list:
        """The current arrays of ``tensors``, uploading any the torch side has changed (or
        may have: tensors whose memory is reachable elsewhere are uploaded every time)."""
        result = []
        with no_guard():
            for tensor in tensors:
                entry = self._entries.get(id(tensor))
                if entry is None or entry.tensor is not tensor or entry.torch_side_changed():
                    try:
                        entry = self._upload(tensor)
                    except SystemError as error:  # Ctrl-C inside C code's Python callback
                        raise_interrupt_behind(error)  # (the tensors uploaded so far are whole)
                        raise
                result.append(entry.array)
        return result

    def update(self, tensors: Sequence[torch.Tensor], arrays: Sequence) -> None:
        """Records new values computed on the JAX side; the torch tensors are now stale (and
        their storage is released where that is safe, see the module docstring)."""
        freed = 0
        shared = []
        with no_guard():
            for tensor, array in zip(tensors, arrays):
                entry = self._entries.get(id(tensor))
                if entry is None or entry.tensor is not tensor:
                    entry = self._new_entry(tensor, array, entry)
                    self._entries[id(tensor)] = entry
                entry.transition("step-result", array=array, synced_version=_count_edit(tensor))
                if (
                    entry.handed_out
                    and not entry.shared  # written, not read: not uploaded
                    and shared_memory.shared_elsewhere(tensor)
                ):
                    entry.transition("share")
                if entry.shared:
                    shared.append(entry)
                else:
                    freed += self._release(entry)
        self._pending = self._pending or bool(tensors)
        host_memory.freed(freed)
        if shared:
            self._write_through(shared)

    def _write_through(self, entries: list) -> None:
        """Writes the new values of tensors whose memory is reachable elsewhere into that
        memory now, before user code can read it there: this waits for the step."""
        fresh = [e.tensor for e in entries if e.tensor not in self._warned_shared]
        if fresh:
            for tensor in fresh:
                self._warned_shared[tensor] = True
            names = ", ".join(self._describe(t) for t in fresh[:8])
            more = f" and {len(fresh) - 8} more" if len(fresh) > 8 else ""
            warn(
                f"The memory of state tensor(s) {names}{more} is shared with something that "
                "reads it directly (a view, `.data`, `.detach()`, a kept `state_dict()` "
                "value, a numpy array, or the numpy array it was made from with "
                "`torch.from_numpy`). So that it shows every step's value, as in eager torch, "
                "each step's result is copied into it right away, which waits for the step "
                "to finish, and copied back before the next step. To avoid that cost, drop "
                "the alias, or keep a copy instead (`.clone()`, `np.array(a, copy=True)`); "
                "for a parameter made from a numpy array you no longer use, give it its own "
                "memory with `p.data = p.data.clone()`.",
                SharedStateWarning,
            )
        split = [e for e in entries if not getattr(e.array, "is_fully_addressable", True)]
        self.materialize([e.tensor for e in entries if e not in split])
        if split:
            names = ", ".join(self._describe(e.tensor) for e in split)
            raise SharedStateError(
                f"The memory of state tensor(s) {names} is shared with something that reads "
                "it directly (a view, `.data`, a kept `state_dict()` value, a numpy array), "
                "but in this job its value is split across processes, so it cannot be copied "
                "there after every step. The step ran and its state is kept. Drop the alias, "
                "or keep a copy (`.clone()`), and read state through `state_dict()` in a "
                "checkpoint closure."
            )

    def _describe(self, tensor: torch.Tensor) -> str:
        name = self.name_of(tensor) if self.name_of is not None else None
        return name or f"of shape {tuple(tensor.shape)}"

    def release_torch_copies(self, tensors: Sequence[torch.Tensor]) -> None:
        """Releases the torch storage of tensors whose arrays hold their values (e.g. state a
        step read but did not write); the next torch access fills it again."""
        freed = 0
        with no_guard():
            for tensor in tensors:
                entry = self._entries.get(id(tensor))
                if (
                    entry is not None
                    and entry.tensor is tensor
                    and not entry.released
                    and not entry.torch_side_changed()
                ):
                    freed += self._release(entry)
        host_memory.freed(freed)

    # ------------------------------------------------------------------ torch storage
    def _release(self, entry: _Entry) -> int:
        """Frees the torch copy of a value the array holds, where that is safe (module
        docstring); returns the bytes freed. Caller: under ``no_guard``."""
        tensor = entry.tensor
        nbytes = tensor.numel() * tensor.element_size()
        if (
            entry.released
            or entry.shared
            or entry.foreign
            or tensor.device.type != "cpu"
            or tensor.layout != torch.strided
            or tensor.is_quantized
            or nbytes < self.release_min_bytes
            # giving it back must not need a collective (a value split across processes)
            or not getattr(entry.array, "is_fully_addressable", True)
            or not _sole_owner(tensor)
        ):
            return 0
        guard(tensor, self)
        if not guarded_by(tensor, self):
            return 0  # a tensor subclass of its own: nothing would fill it again on access
        # Marked first: whatever happens below (an interrupt, a refusal), the next access
        # fills the tensor from the array, never the other way round.
        entry.transition("release")
        self._pending = True
        with thread_settings_kept(), torch.no_grad():
            if not tensor.untyped_storage().resizable():
                # Exported to numpy once (uploads do that), which pins its size for good: a
                # fresh storage takes its place (never written, so it costs no memory).
                try:
                    tensor.set_(torch.UntypedStorage(nbytes), 0, tensor.shape, tensor.stride())
                except RuntimeError:  # torch refuses to change this tensor's storage
                    entry.transition("keep")  # filled again on access all the same
                    return 0
            tensor.untyped_storage().resize_(0)
        entry.transition("freed", synced_version=_count_edit(tensor), storage=_storage_key(tensor))
        return nbytes

    @staticmethod
    def _allocate(tensor: torch.Tensor) -> None:
        """Gives a released tensor its full storage back, uninitialised: the caller fills it
        and only then clears ``released``."""
        nbytes = tensor.numel() * tensor.element_size()
        storage = tensor.untyped_storage()
        if storage.nbytes() < nbytes:
            storage.resize_(nbytes)

    def _lose(self, entry: _Entry) -> None:
        """A released tensor whose value cannot be read back (the step that made it failed):
        it gets its storage back filled with NaN (0 for integer and bool tensors), so it stays
        readable and the loss shows, and it leaves this state."""
        tensor = entry.tensor
        with thread_settings_kept(), torch.no_grad(), no_guard():
            self._allocate(tensor)
            tensor.fill_(math.nan if tensor.is_floating_point() or tensor.is_complex() else 0)
        entry.transition("lose")
        unguard(tensor)
        self._entries.pop(id(tensor), None)

    def is_released(self, tensor: torch.Tensor) -> bool:
        """Whether the torch storage of ``tensor`` is released (its value is only an array)."""
        entry = self._entries.get(id(tensor))
        return entry is not None and entry.tensor is tensor and entry.released

    # ------------------------------------------------------------------ told by the guard
    def before_torch_access(self, tensor: torch.Tensor) -> None:
        """A torch operation is about to use ``tensor``: give it the newest value first."""
        entry = self._entries.get(id(tensor))
        if entry is None or entry.tensor is not tensor:
            return
        if entry.array_is_newer:
            self.materialize([tensor])

    def memory_handed_out(self, tensor: torch.Tensor) -> None:
        """A torch operation returned something that reaches ``tensor``'s memory: edits
        through it are invisible to the tensor's counters, so it is uploaded before the
        next step, and written through after it while the alias lives."""
        entry = self._entries.get(id(tensor))
        if entry is not None and entry.tensor is tensor:
            entry.transition("hand-out")

    def release(self) -> None:
        """Gives every tensor its newest value and plain class back (the backend is going
        away). Values split across processes are left as they are (fetching them would be
        a collective); their storage is never released."""
        local = [
            e.tensor
            for e in self._entries.values()
            if getattr(e.array, "is_fully_addressable", True)
        ]
        try:
            self.materialize(local)
        except StepFailedError:
            pass  # the unreadable values were dropped (or set to NaN where no copy was left)
        for entry in self._entries.values():
            unguard(entry.tensor)
            split = not getattr(entry.array, "is_fully_addressable", True)
            entry.transition("rollback" if split else "drop")
        self._entries.clear()

    # ------------------------------------------------------------------ failures
    def hold_in_torch(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Makes the torch tensors hold their current values (filling released or stale ones
        from their arrays) as a backup against a failing step: after an upload (the first
        step) they already do, at no cost. False, doing nothing, when some value is split
        across processes (fetching it would be a collective)."""
        entries = [self._entries.get(id(t)) for t in tensors]
        if not all(e is None or getattr(e.array, "is_fully_addressable", True) for e in entries):
            return False
        self.materialize(tensors)
        return True

    def recover(
        self, tensors: Sequence[torch.Tensor], arrays: Sequence, backed_up: bool = False
    ) -> str:
        """After a failed step: puts back the state a step consumed (donated) before failing.

        Arrays still alive are kept. A tensor whose array was consumed falls back to its torch
        value: the current one when ``backed_up`` (``hold_in_torch`` ran before the step),
        else the last synchronised one. A tensor whose torch storage was released has no
        value left: it becomes NaN (``_lose``). Returns a sentence saying which happened."""
        lost = [i for i, a in enumerate(arrays) if a.is_deleted()]
        gone = 0
        with no_guard():
            for i in lost:
                tensor = tensors[i]
                entry = self._entries.get(id(tensor))
                if entry is None or entry.tensor is not tensor:
                    continue
                if entry.released:
                    self._lose(entry)
                    gone += 1
                else:
                    entry.transition("rollback")
                    unguard(tensor)
                    del self._entries[id(tensor)]
        self._pending = any(e.array_is_newer for e in self._entries.values())
        if gone:
            return (
                f"{gone} state tensors consumed by the step had no other copy (the torch "
                "copy of large state is released between steps to save memory) and were "
                f"set to NaN; {len(lost) - gone} others were rolled back to their last "
                "synchronised values. Load the last checkpoint to go on."
            )
        if backed_up:
            return "The state of the last good step was restored."
        return (
            f"{len(lost)} state tensors consumed by the step were rolled back to their last "
            "synchronised values (the last state_dict()/checkpoint)."
        )

    def array_of(self, tensor: torch.Tensor):
        """The newest value of ``tensor`` as a JAX array (without touching torch)."""
        return self.arrays([tensor])[0]

    def snapshot(self, tensor: torch.Tensor):
        """A new array holding the tensor's current value, safe from the next step's donation
        (the copy is dispatched asynchronously like any other computation)."""
        return jnp.array(self.array_of(tensor), copy=True)

    def is_stale(self, tensor: torch.Tensor) -> bool:
        entry = self._entries.get(id(tensor))
        return entry is not None and entry.tensor is tensor and entry.array_is_newer

    @property
    def has_pending(self) -> bool:
        return self._pending

    def materialize(self, tensors: Iterable[torch.Tensor] | None = None) -> None:
        """Copies newer JAX values into their torch tensors (in place, keeping identities;
        a released storage is allocated again first).

        A value that cannot be read (the step that made it failed) is dropped, so the torch
        tensor keeps its last synchronised value (NaN if its storage had been released), and
        ``StepFailedError`` says so."""
        if not self._pending:
            return
        if tensors is None:
            entries = list(self._entries.values())
        else:
            entries = [e for e in (self._entries.get(id(t)) for t in tensors) if e is not None]
        _start_reads(e.array for e in entries if e.array_is_newer)
        failed = [failure for e in entries if (failure := self._fill(e)) is not None]
        if tensors is None and not failed:
            self._pending = False
        else:
            self._pending = any(e.array_is_newer for e in self._entries.values())
        if failed:
            raise _failed_values_error(failed) from failed[0][0]

    def _fill(self, entry: _Entry):
        """Copies a newer value into its tensor. If it cannot be read, the entry is dropped
        and ``(error, lost)`` returned: ``lost`` when no copy was left (the tensor was
        released, and now holds NaN, ``_lose``), else it keeps its last synchronised value."""
        if not entry.array_is_newer:
            return None
        try:
            value = array_to_numpy(entry.array)  # where a failed step shows: before any write
        except Exception as error:  # noqa: BLE001 - reported by the caller
            lost = entry.released
            if lost:
                self._lose(entry)
            else:
                entry.transition("rollback")
                unguard(entry.tensor)
                self._entries.pop(id(entry.tensor), None)
            return error, lost
        with thread_settings_kept(), torch.no_grad(), no_guard():
            if entry.released:
                self._allocate(entry.tensor)
            copy_into(entry.tensor, value)
            entry.transition(
                "fill", synced_version=entry.tensor._version, storage=_storage_key(entry.tensor)
            )
        return None

    def retain(self, tensors: Iterable[torch.Tensor]) -> None:
        """Drops entries of tensors that are no longer state (e.g. replaced optimizer state)."""
        keep = {id(t) for t in tensors}
        self._drop([e for k, e in self._entries.items() if k not in keep])

    def _drop(self, entries: list[_Entry]) -> None:
        """A dropped tensor that someone still holds becomes an ordinary tensor with its newest
        value (a released one needs it back), where reading it needs no collective; one held
        by nothing else is simply let go, not filled first."""
        failed = []
        for entry in entries:
            if self._entries.get(id(entry.tensor)) is not entry:
                continue
            del self._entries[id(entry.tensor)]
            held = weakref.ref(entry.tensor)
            # If ours was the last reference, the tensor goes here.
            entry.tensor = None  # type: ignore[assignment]
            tensor = held()
            if tensor is None:
                continue
            entry.tensor = tensor
            self._entries[id(tensor)] = entry  # _fill works on entries of this state
            local = getattr(entry.array, "is_fully_addressable", True)
            if local:
                failure = self._fill(entry)
                if failure is not None:
                    failed.append(failure)
                    continue
            entry.transition("drop" if local else "rollback")  # split: left as it is
            self._entries.pop(id(tensor), None)
            unguard(tensor)
        self._pending = any(e.array_is_newer for e in self._entries.values())
        if failed:
            raise _failed_values_error(failed) from failed[0][0]


def _start_reads(arrays) -> None:
    """Starts the device-to-host copies of all ``arrays`` at once, so that the fills that
    follow wait for one batch of transfers instead of one round trip per tensor (on a GPU,
    hundreds of tensors). A copy that cannot start is left to the fill, which reports it."""
    for array in arrays:
        if getattr(array, "is_fully_addressable", True):
            try:
                array.copy_to_host_async()
            except Exception:  # noqa: BLE001 - e.g. a deleted array: _fill says what failed
                pass


def _failed_values_error(failed: list) -> StepFailedError:
    """The error for values that could not be read back (``(error, lost)`` from ``_fill``)."""
    gone = sum(1 for _, lost in failed if lost)
    what = (
        "They were rolled back to their last synchronised values; the state is readable "
        "and training can go on from there."
    )
    if gone:
        what = (
            f"{gone} of them had no other copy (the torch copy of large state is released "
            "between steps to save memory) and were set to NaN, the others were rolled "
            "back to their last synchronised values. Load the last checkpoint to go on."
        )
    error = failed[0][0]
    return StepFailedError(
        f"{len(failed)} state tensors hold the result of a step that failed "
        f"({type(error).__name__}: {error}). {what}"
    )
