"""Looking inside a traced step's compiled program: its jaxpr, StableHLO, cost analysis, and
the program as a pure JAX function with the state it takes. ``Introspection`` gives
``TracedStep`` these as methods (``jaxpr()``, ``stablehlo()``, ``cost_analysis()``,
``pure_function()``, ``pure_state()``), on the program that served the step's last call
(``ProgramTable.latest``)."""

from __future__ import annotations

from typing import NamedTuple

from cstorch.backend import current_backend_impl
from cstorch.core.programs import ProgramEntry
from cstorch.core.state_names import state_name
from cstorch.core.torch_optimizers import read_scalar
from jax_backend.errors import CstorchRuntimeError, CstorchValueError
from jax_backend.jax_settings import in_engine_scope


def example_arguments(entry: ProgramEntry) -> tuple:
    """``(state arrays, input specs, seed)`` the program can be lowered with, from the
    current state."""
    impl = current_backend_impl()
    view = impl.state_view()
    positions = entry.resolve(view)
    if positions is None:
        raise CstorchRuntimeError("The state this program was compiled for no longer exists.")
    used = impl.device_state.arrays([view.tensors[i] for i in positions[0]])
    return used, entry.program.input_specs(), 0


def jaxpr(entry: ProgramEntry):
    return entry.program.jaxpr(*example_arguments(entry))


def stablehlo(entry: ProgramEntry) -> str:
    return entry.program.stablehlo(*example_arguments(entry))


def cost_analysis(entry: ProgramEntry):
    return entry.program.cost_analysis(*example_arguments(entry))


def pure_function(entry: ProgramEntry):
    """The program as a pure JAX function, run in the engine's JAX settings when called
    directly (see ``TracedStep.pure_function``). A torch optimizer's floats the program reads
    at every call follow the batch in ``inputs``; a batch alone gets their values of now."""
    program = entry.program
    impl = current_backend_impl()
    now = [read_scalar(impl.registry, path) for path in entry.scalar_paths]
    batch = len(program.input_specs()) - len(now)

    def pure(donated, kept, inputs, seed):
        inputs = list(inputs)
        return program.pure_step(
            donated, kept, inputs + now if len(inputs) == batch else inputs, seed
        )

    return in_engine_scope(pure)


def pure_state(entry: ProgramEntry) -> "PureState":
    """The current state arrays of ``entry``'s program, named (see ``TracedStep.pure_state``)."""
    impl = current_backend_impl()
    view = impl.state_view()
    positions = entry.resolve(view)
    if positions is None:
        raise CstorchRuntimeError(
            "The state this program was compiled for no longer exists; call the step once more."
        )
    used_index, written_index = positions
    arrays = impl.device_state.arrays([view.tensors[i] for i in used_index])
    names = [state_name(view.paths[i]) for i in used_index]
    program = entry.program
    donated, kept = program.split_state(arrays)
    donated_names, kept_names = program.split_state(names)
    return PureState(
        donated,
        kept,
        donated_names,
        kept_names,
        [state_name(view.paths[i]) for i in written_index],
        [read_scalar(impl.registry, path) for path in entry.scalar_paths],
        [state_name(path) for path in entry.scalar_paths],
    )


class PureState(NamedTuple):
    """The state a traced step's pure function takes (``TracedStep.pure_state``)."""

    donated: list  # arrays the step overwrites, in the order the pure function takes them
    kept: list  # arrays it only reads
    donated_names: list
    kept_names: list
    written_names: list  # the names of ``new_state``'s arrays, in its order
    # A torch optimizer's floats the step reads at every call (lr, betas, ...): their values
    # now and names (``optimizer0.group.0.lr``); they follow the batch in the inputs.
    hyperparameters: list = []
    hyperparameter_names: list = []

    def advance(self, new_state) -> "PureState":
        """The state for the next step, given the ``new_state`` the pure function returned."""
        if len(new_state) != len(self.written_names):
            raise CstorchValueError(
                f"new_state has {len(new_state)} arrays; the step writes {len(self.written_names)}."
            )
        written = dict(zip(self.written_names, new_state))
        return self._replace(donated=[written[name] for name in self.donated_names])


class Introspection:
    """The methods of ``TracedStep`` that look inside the program that served its last call,
    which the class that mixes them in gives as ``_latest()``."""

    def _latest(self) -> ProgramEntry:
        raise NotImplementedError

    def jaxpr(self):
        """The jaxpr of the most recently compiled program."""
        return jaxpr(self._latest())

    def stablehlo(self) -> str:
        """The StableHLO text of the most recently compiled program."""
        return stablehlo(self._latest())

    def cost_analysis(self):
        return cost_analysis(self._latest())

    def pure_function(self):
        """The most recent program as a pure JAX function (not jitted):
        ``(donated_state, kept_state, inputs, seed) -> (new_state, outputs)``, lists of arrays
        in the program's order; ``seed`` is the int64 scalar its random ops are keyed from
        (see ``jax_backend.Program.pure_step``). :meth:`pure_state` gives the state it takes;
        ``new_state`` is the state the step writes, which ``PureState.advance`` puts back.
        A step with a torch optimizer reads its floats (lr, betas, ...) at every call: they
        follow the batch in ``inputs`` (``state.hyperparameters``, named by
        ``state.hyperparameter_names``); given the batch alone, it uses their values at the
        time ``pure_function()`` was called::

            f, state = jax.jit(step.pure_function()), step.pure_state()
            with jax.enable_x64(True):  # int64/float64 state keeps its dtypes
                new_state, outputs = f(state.donated, state.kept, [x, y], 0)
            state = state.advance(new_state)

        Called directly it runs in the engine's JAX settings (64-bit types,
        ``jax_backend.jax_settings``); inside your own ``jax.jit``, turn 64-bit types on for
        the call as above (JAX narrows int64/float64 arguments otherwise).
        """
        return pure_function(self._latest())

    def pure_state(self) -> PureState:
        """The current state arrays of the most recent program, in the order
        :meth:`pure_function` takes them, with their names (``model0.fc.weight``,
        ``optimizer0.state.0.exp_avg``, ...). These are the live arrays: a later call of the
        cstorch step donates (deletes) those in ``donated``; copy them to keep them."""
        return pure_state(self._latest())
