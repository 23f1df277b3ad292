"""State born in a step: tensors a step creates in a place that outlives it.

Eager torch creates some state lazily, inside the first step that needs it: a torch
optimizer's ``exp_avg``/``step`` (or SGD's momentum buffer, a copy of the first gradient), a
buffer a module registers in ``forward``. The first step runs the creation and the update;
later steps only the update. A compiled step does the same with two programs, both compiled
at the first call (so the CSX backend never recompiles): the capture that sees state being
born returns its end-of-step values as outputs, and that program runs once; the slots then
hold real tensors (``install``) whose device values are those outputs, and the step is
captured again with them as ordinary state for every later call. No tensor of the trace is
left in a slot. ``FirstAndSteady`` is that pair of programs, filed in the step's program
table like any one program.

A tensor the step stores as a plain attribute of a compiled model's module (torch's old
``weight_norm`` recomputes ``weight`` so before every forward; a loss module keeps its last
input) is an output of the program instead (``stored_attributes``): after every call the
attribute holds that step's value, as in eager torch.

``leaked_fake_tensors`` is the check after every capture that no other tensor of the trace
stayed where the user can reach it (a tensor in a list on a module, a Python value in
optimizer state): such a tensor has no value, so the capture fails, naming the place.
"""

from __future__ import annotations

import dataclasses

import torch
from torch._subclasses.fake_tensor import FakeTensor

from cstorch.core.state_names import state_name
from jax_backend import scalars
from jax_backend.errors import CaptureError
from jax_backend.user_frames import current_user_frame


@dataclasses.dataclass
class Born:
    """One tensor born in a step, and every slot that holds it."""

    tensor: torch.Tensor  # the trace's tensor; after ``install`` the real one
    paths: list
    slots: list


def find(registry, known_paths, existing) -> list:
    """Inside the trace, after the step body: the tensors in slots that did not exist before
    (``known_paths``) and that are not existing state (``existing``: ids of state tensors)."""
    born = {}
    for path, slot in registry.state_slots():
        if path in known_paths:
            continue
        tensor = slot.get()
        if not isinstance(tensor, torch.Tensor) or id(tensor) in existing:
            continue
        entry = born.setdefault(id(tensor), Born(tensor, [], []))
        entry.paths.append(path)
        entry.slots.append(slot)
    return list(born.values())


def install(registry, born: list) -> None:
    """Puts a real tensor (zeros, with the traced tensor's shape and dtype) in every slot of
    each born tensor, in place of the trace's."""
    for entry in born:
        fake = entry.tensor
        real = torch.zeros(tuple(fake.shape), dtype=fake.dtype)
        for slot in entry.slots:
            slot.set(real)
        entry.tensor = real
    registry.state_changed()  # new slots: the cached view does not list them


def snapshot(registry) -> dict:
    """What ``discard`` needs to undo births: the slot paths and each optimizer's state keys."""
    return {
        "paths": {path for path, _ in registry.state_slots()},
        "optimizer_keys": [(o, set(map(id, o.state))) for o in registry.optimizers],
    }


def discard(registry, before: dict) -> None:
    """Removes every slot born since ``before`` (a failed or abandoned capture, a first step
    that failed), and the per-parameter state dicts an optimizer made for them, so the next
    capture starts from the state as it was."""
    for path, slot in reversed(registry.state_slots()):
        if path not in before["paths"] and slot.key in slot.container:
            del slot.container[slot.key]
    for optimizer, keys in before["optimizer_keys"]:
        for param in [p for p, state in optimizer.state.items() if id(p) not in keys and not state]:
            del optimizer.state[param]
    registry.state_changed()


class FirstAndSteady:
    """The two programs of a step whose first call gives birth to state: ``first`` runs once,
    at that call, and its last outputs are the born tensors' values; ``steady`` takes them as
    state and serves every later call. The program table files the pair like any entry and
    selects it as its steady program (``programs.ProgramEntry``)."""

    def __init__(self, first, steady, born: list, before: dict):
        self.first, self.steady = first, steady
        self.born = born  # Born, installed: their slots hold real tensors
        self.before = before  # snapshot from before the first capture (to undo the births)

    @property
    def program(self):
        return self.steady.program

    def resolve(self, view):
        return self.steady.resolve(view)

    def mismatch(self, view) -> str | None:
        return self.steady.mismatch(view)

    def hyperparameter_mismatch(self, current: list, registry) -> str | None:
        return self.steady.hyperparameter_mismatch(current, registry)

    def next_program(self):
        """``first`` until it has run (``gave_birth``), then ``steady``."""
        return self.steady if self.first is None else self.first

    @property
    def gives_birth(self) -> bool:
        """Whether the next call runs ``first``."""
        return self.first is not None

    def gave_birth(self, backend, values: list) -> None:
        """After ``first`` ran: the born tensors' end-of-step ``values`` (lazy tensors)
        become their device values (with a multi-device layout they go through the host and
        are placed at the next upload); the pair serves as ``steady`` from now on."""
        tensors = [b.tensor for b in self.born]
        if backend.layout is None:
            backend.device_state.update(tensors, [v.jax_array for v in values])
        else:
            with torch.no_grad():
                for tensor, value in zip(tensors, values):
                    tensor.copy_(value.materialize())
        self.first, self.born, self.before = None, [], None

    def undo(self, backend) -> None:
        """``first`` did not run (it failed, or the call only compiled): the slots it would
        have filled are taken out, so that the next call captures both programs again."""
        discard(backend.registry, self.before)


def refuse_parameters(born: list) -> None:
    """A parameter created in the step would get its initial values from the compiled
    step's random stream, and the optimizer would not know it: refused."""
    for entry in born:
        if isinstance(entry.tensor, torch.nn.Parameter):
            raise CaptureError(
                f"The step created the parameter {state_name(entry.paths[0])} (a parameter "
                "registered in forward): a compiled step cannot create parameters. Create it "
                "in the module's __init__, or run one forward pass eagerly before the first "
                "step (`model(example_batch)`) so it exists before compiling."
            )


class ParameterWatch:
    """During a capture: a parameter registered in a compiled model (``register_parameter``,
    a lazy module's materialisation) fails at once, naming the user's line."""

    def __init__(self, registry):
        self._registry = registry
        self._handle = None

    def __enter__(self):
        def registered(module, name, param):
            models = self._registry.models
            if param is not None and any(module is m for model in models for m in model.modules()):
                where = current_user_frame()
                raise CaptureError(
                    f"The step registers the parameter {name!r} on a {type(module).__name__} "
                    "of a compiled model: a compiled step cannot create parameters. Create it "
                    "in the module's __init__, or run one forward pass eagerly before the "
                    "first step (`model(example_batch)`)." + (f"\n{where}" if where else "")
                )

        self._handle = torch.nn.modules.module.register_module_parameter_registration_hook(
            registered
        )
        return self

    def __exit__(self, *exc):
        self._handle.remove()


# ---------------------------------------------------------------- module attributes
def module_attributes(registry) -> dict:
    """Before the step body: each compiled module's plain attributes (to put back those the
    step replaces with its own tensors, ``restore_attributes``)."""
    return {
        id(module): dict(vars(module)) for model in registry.models for module in model.modules()
    }


def stored_attributes(registry, allowed=()) -> list:
    """After the step body: ``((model index, module name, attribute), tensor)`` of every
    plain attribute of a compiled model's module holding a tensor of the trace (not a
    parameter or buffer, not one of ``allowed``: born state)."""
    allowed = set(allowed)
    found = []
    for m, model in enumerate(registry.models):
        for name, module in model.named_modules():
            for key, value in vars(module).items():
                if isinstance(value, FakeTensor) and id(value) not in allowed:
                    found.append(((m, name, key), value))
    return found


def restore_attributes(registry, before: dict) -> None:
    """After a capture, also one that stopped half-way: each plain module attribute the step
    body set to a tensor of the trace holds what it held before the body (``before``:
    ``module_attributes``), or is gone again; a program's run gives it its value."""
    for model in registry.models:
        for module in model.modules():
            earlier = before.get(id(module))
            if earlier is None:
                continue
            attributes = vars(module)
            for key in [k for k, v in attributes.items() if isinstance(v, FakeTensor)]:
                if key in earlier:
                    attributes[key] = earlier[key]
                else:
                    del attributes[key]


def attribute_holders(registry, paths: list) -> list:
    """``(module __dict__, attribute)`` of each path of ``stored_attributes``."""
    return [(vars(registry.models[m].get_submodule(name)), key) for m, name, key in paths]


# ------------------------------------------------------------------------- leaked tensors
def leaked_fake_tensors(registry, allowed=()) -> list:
    """``(where, container, key)`` of every tensor of a trace, or number computed from a
    hyperparameter the trace took as an input (a torch symbolic float), left in a registered
    model (module attributes, parameters, buffers), optimizer (state, param groups) or other
    stateful object, but the ids in ``allowed`` (born tensors about to be installed)."""
    found = []
    allowed = set(allowed)

    def visit(value, where, container, key, depth):
        if isinstance(value, FakeTensor) or scalars.is_symbolic(value):
            if id(value) not in allowed:
                found.append((where, container, key))
        elif depth < 4 and isinstance(value, dict):
            for k, v in list(value.items()):
                visit(v, f"{where}[{k!r}]", value, k, depth + 1)
        elif depth < 4 and isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(v, f"{where}[{i}]", value, i, depth + 1)

    for m, model in enumerate(registry.models):
        for name, module in model.named_modules():
            label = f"model{m}" + (f".{name}" if name else "")
            for k, v in list(vars(module).items()):
                if k in ("_parameters", "_buffers"):
                    for n, t in list(v.items()):
                        visit(t, f"{label}.{n}", v, n, 4)
                elif k != "_modules":
                    visit(v, f"{label}.{k}", vars(module), k, 1)
    for o, optimizer in enumerate(registry.optimizers):
        position = {
            id(p): i
            for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])
        }
        for param, state in list(optimizer.state.items()):
            visit(
                state,
                f"optimizer{o}.state[{position.get(id(param), '?')}]",
                optimizer.state,
                param,
                1,
            )
        visit(optimizer.param_groups, f"optimizer{o}.param_groups", None, None, 1)
    for kind, objects in (
        ("scheduler", registry.schedulers),
        ("metric", registry.metrics),
        ("stateful", registry.stateful_objects),
    ):
        for i, obj in enumerate(objects):
            for k, v in list(getattr(obj, "__dict__", {}).items()):
                visit(v, f"{kind}{i}.{k}", vars(obj), k, 2)
    return found


def check_no_leaks(registry, allowed=()) -> None:
    """Raises CaptureError if a tensor of the trace stayed in user-visible state; each one
    found is taken out first (deleted, or set to None where it cannot be deleted)."""
    leaks = leaked_fake_tensors(registry, allowed)
    if not leaks:
        return
    values = [container[key] for _where, container, key in leaks if container is not None]
    for _where, container, key in leaks:
        if isinstance(container, dict):
            del container[key]
        elif isinstance(container, list):
            container[key] = None
    places = ", ".join(where for where, _, _ in leaks[:5])
    if any(scalars.is_symbolic(value) for value in values):
        raise CaptureError(
            f"The step stored a number computed from an optimizer's hyperparameter (its lr, "
            f"momentum, ...) in {places}: inside the compiled step such a number is an input "
            "of the program, with no value after the trace. Read the hyperparameter outside "
            'the step (`optimizer.param_groups[0]["lr"]` holds each step\'s value there), '
            "or return it from the step as a tensor (`torch.as_tensor(...)`)."
        )
    raise CaptureError(
        f"The step stored a tensor it computed in {places}, outside the state a compiled step "
        "carries between steps: that tensor has no value after the trace. Register it as a "
        "buffer in the module's __init__ (`self.register_buffer(name, tensor)`) and update it "
        "in place, or return it from the step (or pass it to a @cstorch.step_closure) to "
        "read it. (A tensor kept as a plain attribute of a compiled model's module is "
        "supported: it holds each step's value.)"
    )
