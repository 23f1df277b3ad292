"""The backend's registries: every object whose state outlives a step, and that state's slots.

Compiled models, optimizers (cstorch's and adopted ``torch.optim`` ones), LR schedulers, grad
scalers, metrics, sparsity algorithms and other stateful objects (anything exposing
``_cstorch_state_slots()``) register here, in order. ``state_slots`` names every place holding
one of their tensors by a path; ``state_view`` is the cached ``StateView`` of those slots,
recollected when a registration, a ``load_state_dict`` or a rebinding may have changed them.
"""

from __future__ import annotations

import dataclasses

import torch

from cstorch.backend.state_view import StateView, read_deferred_state
from jax_backend import Slot, shared_memory


class Registry:
    """The registered stateful objects of one backend, and their state's slots."""

    def __init__(self):
        self.models: list = []
        self.optimizers: list = []
        self.schedulers: list = []
        self.grad_scalers: list = []
        self.metrics: list = []
        self.stateful_objects: list = []  # anything else exposing _cstorch_state_slots()
        self.sparsity: list = []  # cstorch.sparse algorithms, in creation order
        self._epoch = 0  # bumped whenever the set of state tensors may have changed
        self._view = None

    def state_changed(self, *args, **kwargs) -> None:
        """The set of state tensors may have changed: the next ``state_view`` recollects it
        (a hook's arguments are ignored)."""
        self._epoch += 1

    # ------------------------------------------------------------------ registration
    def add_model(self, model: torch.nn.Module) -> bool:
        """Registers ``model``; False if it already was."""
        if model in self.models:
            return False
        self.models.append(model)
        self.state_changed()
        return True

    def add_optimizer(self, optimizer) -> None:
        shared_memory.note_resizable(
            [v for state in optimizer.state.values() for v in state.values()]
            + [v for group in optimizer.param_groups for v in group.values()]
        )
        self.optimizers.append(optimizer)
        self.state_changed()

    def add_scheduler(self, scheduler) -> None:
        self.state_changed()
        if scheduler not in self.schedulers:
            self.schedulers.append(scheduler)
        scheduler.optimizer._schedulers_registry[scheduler] = None
        if not isinstance(scheduler.last_epoch, torch.Tensor):
            scheduler.last_epoch = torch.tensor(scheduler.last_epoch, dtype=torch.int64)
        shared_memory.note_resizable([scheduler.last_epoch])

    def add_grad_scaler(self, scaler) -> None:
        self.grad_scalers.append(scaler)
        self.state_changed()

    def add_metric(self, metric) -> None:
        self.metrics.append(metric)
        self.state_changed()

    def add_stateful(self, obj) -> None:
        self.stateful_objects.append(obj)
        self.state_changed()

    def add_sparsity(self, sparsity) -> None:
        """A ``cstorch.sparse`` algorithm: its state is carried between steps and its masks
        are initialised before the first step (``initialize_sparsity``: at a run's start, or
        the capture of a traced step)."""
        self.sparsity.append(sparsity)
        self.add_stateful(sparsity)

    def initialize_sparsity(self) -> None:
        """Initialises every sparsity mask not yet initialised or loaded."""
        for sparsity in self.sparsity:
            sparsity.initialize()

    # ------------------------------------------------------------------ state
    def state_slots(self) -> list[tuple[tuple, Slot]]:
        """Every place holding a tensor that outlives a step, as ``(path, slot)`` pairs.

        A path names the place independently of the tensor in it and of other registered
        objects (registries only grow), so a compiled step can find its state again after
        new models, optimizers or metrics were registered."""
        entries = []
        for m, model in enumerate(self.models):
            for name, module in model.named_modules():
                entries += [
                    (("model", m, name, "param", n), Slot(module._parameters, n))
                    for n, p in module._parameters.items()
                    if p is not None
                ]
                entries += [
                    (("model", m, name, "buffer", n), Slot(module._buffers, n))
                    for n, b in module._buffers.items()
                    if b is not None
                ]
        for o, optimizer in enumerate(self.optimizers):
            position = {}
            for g, group in enumerate(optimizer.param_groups):
                entries += [
                    (("optimizer", o, "group", g, k), Slot(group, k))
                    for k, v in group.items()
                    if k != "params" and isinstance(v, torch.Tensor)
                ]
                for p in group["params"]:
                    position.setdefault(id(p), len(position))
            for param, state in optimizer.state.items():
                where = position.get(id(param), ("unlisted", id(param)))
                entries += [
                    (("optimizer", o, "state", where, k), Slot(state, k))
                    for k, v in state.items()
                    if isinstance(v, torch.Tensor)
                ]
        for kind, objects in (
            ("scheduler", self.schedulers),
            ("scaler", self.grad_scalers),
            ("metric", self.metrics),
            ("stateful", self.stateful_objects),
        ):
            for i, obj in enumerate(objects):
                entries += [((kind, i, slot.key), slot) for slot in obj._cstorch_state_slots()]
        # Named as everywhere else (``cstorch.core.state_names``), so capture errors say which
        # state they are about in the spelling of recompile reasons and the export manifest.
        from cstorch.core.state_names import state_name  # cstorch.core imports this module

        return [(path, dataclasses.replace(slot, name=state_name(path))) for path, slot in entries]

    @property
    def cached_view(self) -> StateView | None:
        """The last view collected, without recollecting it (it may be out of date)."""
        return self._view

    def state_view(self, device_state) -> StateView:
        """The current state slots and unique state tensors, recollected only when needed
        (``device_state`` then retains the new view's tensors).

        The cached view stays valid while no stateful object was registered or loaded (the
        epoch) and every slot still holds the tensor it held (catches rebinding)."""
        view = self._view
        groups = self.param_group_sizes()
        if (
            view is None
            or view.epoch != self._epoch
            or view.group_sizes != groups
            or not view.still_holds()
        ):
            self._view = None  # it holds the old tensors: retain may let them go
            entries = self.state_slots()
            read_deferred_state(entries)
            view = StateView(self._epoch, entries)
            view.optimizer_params = self.optimizer_links(view)
            view.group_sizes = groups
            shared_memory.note_resizable(view.tensors)
            device_state.retain(view.tensors)
            self._view = view
        return view

    def param_group_sizes(self) -> tuple:
        """How many parameters each param group of each optimizer has: ``add_param_group``
        (which no hook reports) changes the state a step updates."""
        return tuple(
            tuple(len(group["params"]) for group in optimizer.param_groups)
            for optimizer in self.optimizers
        )

    def optimizer_links(self, view) -> tuple:
        """Per optimizer, per group: the state path of each parameter it updates (None for
        one that is not state). A program captured the optimizer updating those tensors;
        replacing a model's parameter (the optimizer keeps the old one, as in eager torch)
        changes this and so needs another program."""
        path_of = dict(zip(map(id, view.tensors), view.paths))
        return tuple(
            tuple(
                tuple(path_of.get(id(p)) for p in group["params"])
                for group in optimizer.param_groups
            )
            for optimizer in self.optimizers
        )
