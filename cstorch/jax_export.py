"""``cstorch.export``: a traced step and its state, written for JAX alone.

``cstorch.export(training_step, example_batch, path)`` takes the program the step was compiled
into for batches like ``example_batch`` and the state as it is now (parameters, buffers,
optimizer and scheduler state), and writes a directory that a process with JAX but without
torch loads and continues from (see ``jax_backend.exported``): the same step, the same
numbers. Python values in the step (hyperparameters that are plain numbers) are constants of
the exported program, as they are of the compiled one; a torch optimizer's floats (``lr``,
``betas``, ...), which the compiled step reads at every call, are in the exported state (kind
"hyperparameter", e.g. ``optimizer0.group.0.lr``), fed to the program at every call of the
exported step: set them there to schedule them from JAX.

``cstorch.torch_state_dict(jax_state)`` is the way back: arrays named as the export names
them (``model0.fc.weight``, e.g. parameters trained by optax on an exported forward step) as
one model's torch ``state_dict``, for ``model.load_state_dict`` and ``cstorch.save``.
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import torch
from torch.utils import _pytree as pytree

from cstorch.backend import current_backend_impl
from cstorch.core.state_names import state_name
from cstorch.core.step_call import StepCall
from cstorch.core.torch_optimizers import read_scalar
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError, CstorchValueError
from jax_backend.export import export_program


def export(step, example_batch, path: str, *, vjp_order: int = 0, platforms=None) -> str:
    """Writes ``step`` (a ``@cstorch.trace`` function) for batches shaped like
    ``example_batch`` (a tensor, or a tuple/list of the step's positional arguments) and the
    current state to the directory ``path``; returns its absolute path.

    The step need not have run: if it was not compiled for such batches (in the current
    train/eval and grad mode), it is compiled now, without running it. The exported state is
    the state as it is now, before any further step, so the exported step's first result is
    what the next call of ``step`` would return.

    ``vjp_order=1`` also exports the derivative, so that ``ExportedStep.pure`` can be
    differentiated (e.g. a forward-only step as the apply function of a flax ``TrainState``).
    ``platforms`` (e.g. ``("cpu", "cuda")``) are those the artifact may run on (default: this
    backend's).
    """
    from cstorch.core.compile import TracedStep

    if not isinstance(step, TracedStep):
        raise CstorchTypeError(
            f"cstorch.export expects a @cstorch.trace step function, got {type(step).__name__}."
        )
    impl = current_backend_impl()
    if impl.engine != "jax":
        raise CstorchRuntimeError(
            f"cstorch.export needs the compiled program of the JAX engine, but the backend "
            f'runs the {impl.engine!r} engine. Create the backend with engine="jax" (and '
            "unset CSTORCH_ENGINE)."
        )
    args = tuple(example_batch) if isinstance(example_batch, (tuple, list)) else (example_batch,)
    if not any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(args)):
        raise CstorchTypeError(
            "cstorch.export needs an example batch of tensors (a tensor, or a "
            "tuple/list of the step's positional arguments)."
        )
    entry, call = step.program_for(StepCall.of(impl, args, {}))
    if entry is None:  # its first step creates state (e.g. a torch optimizer's): not exportable
        raise CstorchRuntimeError(
            f"{step.__name__!r} creates state in its first step (e.g. a torch.optim "
            "optimizer's exp_avg or momentum buffer, or a buffer registered in forward), "
            "which has no value yet. Run the step once, then export it."
        )
    view = call.view
    used_index, written_index = entry.resolve(view)
    indices = list(dict.fromkeys(list(used_index) + list(written_index)))
    names = {}
    for i in indices:  # readable names; a (theoretical) clash gets the position appended
        name = state_name(view.paths[i])
        names[i] = name if name not in names.values() else f"{name}#{i}"
    arrays = impl.device_state.arrays([view.tensors[i] for i in indices])
    state = {names[i]: array for i, array in zip(indices, arrays)}
    state_info = [
        {
            "name": names[i],
            "kind": _state_kind(view.paths[i]),
            "path": [str(p) for p in view.paths[i]],
        }
        for i in indices
    ]
    hyperparameters = [state_name(p) for p in entry.scalar_paths]
    for name, scalar_path in zip(hyperparameters, entry.scalar_paths):
        state[name] = np.float64(read_scalar(impl.registry, scalar_path))
        state_info.append(
            {"name": name, "kind": "hyperparameter", "path": [str(p) for p in scalar_path]}
        )
    returned, single, closure_values = _output_layout(entry)
    return export_program(
        entry.program,
        path,
        state,
        state_info,
        [names[i] for i in used_index],
        [names[i] for i in written_index],
        returned,
        single,
        closure_values,
        hyperparameters=hyperparameters,
        function=step.__name__,
        vjp_order=vjp_order,
        platforms=platforms if platforms is not None else [_platform(impl.jax_devices[0])],
    )


def torch_state_dict(state: dict, model=0) -> dict:
    """The ``state_dict`` of ``model`` from arrays named as ``cstorch.export`` names its state
    (``model0.fc.weight``, ``model0.bn.running_mean``): the prefix is dropped, every other name
    is kept, and JAX or numpy arrays become CPU tensors of their own dtype. ``model`` is the
    module compiled with ``cstorch.compile`` in this process, or its index (0: the first
    compiled; the ``N`` of ``modelN.``). Names of other models, optimizers or schedulers are
    left out. For ``model.load_state_dict(...)`` (which checks names and shapes) and
    ``cstorch.save``."""
    if not isinstance(state, dict):
        raise CstorchTypeError(
            f"torch_state_dict expects a dict of arrays by state name, got {type(state).__name__}."
        )
    if isinstance(model, torch.nn.Module):
        impl = current_backend_impl(raise_exception=False)
        models = list(getattr(impl, "models", []))
        index = next((i for i, m in enumerate(models) if m is model), None)
        if index is None:
            raise CstorchValueError(
                "torch_state_dict: this module was not compiled with "
                "cstorch.compile in this process; pass the index N of the "
                "exported names modelN. instead."
            )
        model = index
    prefix = f"model{model}."
    result = {}
    for name, array in state.items():
        if isinstance(name, str) and name.startswith(prefix):
            result[name[len(prefix) :]] = _tensor(name, array)
    if not result:
        models = sorted(
            {
                m.group(0)
                for n in state
                if isinstance(n, str)
                for m in [re.match(r"model\d+", n)]
                if m
            }
        )
        raise CstorchValueError(
            f"no state of model {model} (names starting with {prefix!r}) among "
            f"{len(state)} arrays"
            + (
                f"; there are {', '.join(models)}"
                if models
                else f" named like {str(next(iter(state), '-'))!r}"
            )
            + ". Pass the arrays of an exported step (step.state, step.params(), "
            "step.buffers()) and the model's index."
        )
    return result


def _tensor(name: str, array) -> torch.Tensor:
    """A CPU tensor of ``array``'s dtype (bfloat16, which numpy lacks, through float32)."""
    host = np.asarray(array)
    if host.dtype.name == "bfloat16":
        return torch.from_numpy(host.astype(np.float32)).to(torch.bfloat16)
    if host.dtype.kind not in "biufc":
        raise CstorchTypeError(f"{name}: cannot make a tensor of an array of dtype {host.dtype}.")
    return torch.from_numpy(np.array(host))  # a copy: the tensor owns writable memory


def _platform(device) -> str:
    """jax.export's name for the platform of ``device`` ("cpu", "cuda", "rocm", "tpu")."""
    from jax import export as jax_export

    if device.platform == "gpu":  # jax.export names the GPU flavour
        return jax_export.default_export_platform()
    return device.platform


def _state_kind(path: tuple) -> str:
    if path[0] == "model":
        return path[3]  # "param" or "buffer"
    return path[0]


def _output_layout(entry):
    """Indices (among the program's tensor outputs) of the returned tensors, whether the step
    returned a single tensor, and the closure arguments' outputs by name."""
    captured = entry.captured
    position, count = [], 0
    for is_tensor in captured.output_is_tensor:
        position.append(count if is_tensor else None)
        count += int(is_tensor)
    user, payloads, *_ = pytree.tree_unflatten(list(range(len(position))), captured.output_spec)
    returned = [position[i] for i in pytree.tree_leaves(user) if position[i] is not None]
    single = isinstance(user, int) and position[user] is not None
    closure_values = []
    for (kind, fn), (args, kwargs) in zip(entry.closures, payloads):
        label = getattr(fn, "__name__", kind)
        for name, value in _named_arguments(fn, args, kwargs):
            for path, leaf in pytree.tree_flatten_with_path(value)[0]:
                if position[leaf] is not None:
                    closure_values.append(
                        {"name": f"{label}.{name}{pytree.keystr(path)}", "index": position[leaf]}
                    )
    return returned, single, closure_values


def _named_arguments(fn, args, kwargs) -> list:
    """``[(parameter name, value)]`` of a closure call (``arg0``, ... if it cannot be bound)."""
    try:
        return list(inspect.signature(fn).bind(*args, **kwargs).arguments.items())
    except (TypeError, ValueError):
        return [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
