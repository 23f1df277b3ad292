"""Running one compiled program of a traced step for a call.

The program's run is a transaction on the backend's device state (``jax_backend.Program.run``:
the state it reads is gathered, the new state recorded only if the call went through). Around
it the run does what the step body did in eager torch besides its tensor maths: torch LR
schedulers' deferred ``step()`` calls (``torch_optimizers``), the step closures it called
(queued with this step's values), the optimizers' and schedulers' Python step counters, the
tensors it keeps on modules (``born_state``), and which parameters now hold a gradient.
"""

from __future__ import annotations

from torch.utils import _pytree as pytree

from cstorch.core import torch_optimizers
from cstorch.core.programs import ProgramEntry
from cstorch.core.step_call import StepCall
from jax_backend import LazyTensor
from jax_backend.dtypes import tensor_to_host


def _input_array(tensor):
    if isinstance(tensor, LazyTensor):
        return tensor.jax_array
    return tensor_to_host(tensor)


def run(call: StepCall, entry: ProgramEntry) -> tuple:
    """Runs ``entry``'s program for ``call``: ``(outputs, born)``, the step's outputs (its
    tensors as ``LazyTensor``s) and the end-of-step values of the tensors born in it (those
    of a first program, ``born_state.FirstAndSteady``; else empty)."""
    backend, view = call.backend, call.view
    used_index, written_index = entry.resolve(view)
    captured, program = entry.captured, entry.program
    torch_optimizers.run_scheduler_steps(entry.host_calls, "before")
    inputs = [_input_array(call.leaves[i]) for i in call.tensor_positions]
    inputs += [torch_optimizers.read_scalar(backend.registry, path) for path in entry.scalar_paths]
    seed = backend.draw_seed() if program.uses_rng else 0
    outputs = program.run(
        backend.device_state,
        [view.tensors[i] for i in used_index],
        [view.tensors[i] for i in written_index],
        inputs,
        seed,
    )
    torch_optimizers.run_scheduler_steps(entry.host_calls, "after")
    backend.modes.step_held_gradients(
        p for p, held in zip(view.parameters, entry.gradients_held) if held
    )

    produced = iter(outputs)
    flat = [
        LazyTensor(next(produced)) if is_tensor else constant
        for is_tensor, constant in zip(captured.output_is_tensor, captured.output_constants)
    ]
    for i in captured.scalar_outputs:  # a Python number computed from a runtime float
        flat[i] = flat[i].item()
    user_outputs, payloads, born, stored = pytree.tree_unflatten(flat, captured.output_spec)
    for (attributes, name), value in zip(entry.stored_attributes, stored):
        attributes[name] = value  # a tensor the step keeps on a module (born_state)
    for (kind, fn), (args, kwargs) in zip(entry.closures, payloads):
        backend.closures.add(kind, fn, args, kwargs)
    for obj, increment in entry.counter_steps:
        obj._step_count += increment
    return user_outputs, born
