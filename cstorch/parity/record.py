"""One engine's side of a parity run: runs an unchanged cstorch script and records it.

``python -m cstorch.parity.record --engine eager|jax --backend cpu|gpu|csx [--float32]
--out FILE script.py [args...]`` runs the script in this process (as ``__main__``): every
``cstorch.backend(...)`` it creates is served by that backend with that engine
(``cstorch.config``'s ``serve_backend`` and ``engine``), in float32 with ``--float32`` unless
the script chooses a precision. It records every value passed to a step or checkpoint closure
(by step, closure and argument name) and, at the end, every model's and optimizer's state
(torch's own optimizers included: both engines register them), and writes them to ``FILE``
(an ``.npz`` without pickles plus a JSON index inside it). It watches the run through public
hooks only (``cstorch.backend.run_hooks``, the traced-tensor listener).

``--perturb`` moves every floating-point parameter by about one rounding step
(``PERTURBATION``) as its model is registered: the rerun that shows which final state the
engine cannot reproduce itself (values that follow rounding noise, see ``runner``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import runpy
import sys

import numpy as np


class Recorder:
    """Closure values by step: ``values[(step, name)] = float64 array`` (``dtypes`` keeps
    each value's own dtype); ``step`` counts the executor's batches (closures run before the
    first batch belong to step 0), or the steps called outside an executor."""

    def __init__(self):
        self.step = 0
        self.values: dict = {}
        self.dtypes: dict = {}
        self.random_ops: set = set()  # random torch functions in captured steps (JAX engine)
        self.precision = "float32"  # the compute dtype of the run (mixed precision: half)

    def note_precision(self, impl) -> None:
        if impl is not None:
            self.precision = impl.precision_policy().compute_dtype or "float32"

    def wrap(self, fn):
        recorder = self
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            signature = None
        label = getattr(fn, "__name__", "closure")

        def recorded(*args, **kwargs):
            recorder.record(label, signature, args, kwargs)
            return fn(*args, **kwargs)

        return recorded

    def record(self, label, signature, args, kwargs):
        import torch

        named = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
        if signature is not None:
            try:
                named = list(signature.bind(*args, **kwargs).arguments.items())
            except TypeError:
                pass
        for name, value in named:
            leaves, _ = torch.utils._pytree.tree_flatten_with_path(value)
            for path, leaf in leaves:
                array = _numeric(leaf)
                if array is None:
                    continue
                key = f"{label}.{name}{torch.utils._pytree.keystr(path)}"
                if (self.step, key) in self.values:  # the same closure twice in a step
                    repeat = 1
                    while (self.step, f"{key}#{repeat}") in self.values:
                        repeat += 1
                    key = f"{key}#{repeat}"
                self.values[(self.step, key)] = array
                self.dtypes[(self.step, key)] = _dtype_name(leaf)


def _numeric(value):
    """A float64 copy of a tensor, number or array; None for anything else."""
    import torch

    if isinstance(value, bool):
        return np.asarray(float(value))
    if isinstance(value, (int, float)):
        return np.asarray(float(value))
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return None
        return value.detach().to(torch.float64).cpu().numpy().copy()
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return value.astype(np.float64)
    return None


def _dtype_name(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return str(value.dtype).replace("torch.", "")
    if isinstance(value, np.ndarray):
        return str(value.dtype)
    return "python"


def install(recorder: Recorder) -> list:
    """Records every closure's values by step, and the run's precision and random ops, through
    the backend's public hooks (``cstorch.backend.run_hooks``) and the traced-tensor listener
    (``cstorch.experimental.listener``). Returns their handles."""
    from cstorch.backend import current_backend_impl, run_hooks
    from cstorch.experimental.listener import register_traced_tensor_hook

    def at_step_end():
        recorder.step += 1
        recorder.note_precision(current_backend_impl(raise_exception=False))

    def before_closure(closure, args, kwargs):
        recorder.note_precision(current_backend_impl(raise_exception=False))
        try:
            signature = inspect.signature(closure)
        except (TypeError, ValueError):
            signature = None
        recorder.record(getattr(closure, "__name__", "closure"), signature, args, kwargs)

    def note_random(tensor, name):
        function = name.rsplit(".", 1)[0] if name.rsplit(".", 1)[-1].isdigit() else name
        function = function.rsplit(".", 1)[-1]  # without the debug scope
        if is_random_function(function):
            recorder.random_ops.add(function)

    return [
        run_hooks.register_step_end_hook(at_step_end),
        run_hooks.register_closure_hook(before_closure),
        register_traced_tensor_hook(note_random),
    ]


#: torch functions that draw random numbers (names as the traced-tensor listener reports
#: them, without a trailing underscore); any ``*dropout*`` function too.
RANDOM_FUNCTIONS = frozenset(
    {
        "rand",
        "randn",
        "rand_like",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "bernoulli",
        "multinomial",
        "normal",
        "uniform",
        "exponential",
        "geometric",
        "cauchy",
        "log_normal",
        "random",
        "poisson",
        "rrelu",
        "gumbel_softmax",
    }
)


def is_random_function(name: str) -> bool:
    return "dropout" in name or name.rstrip("_") in RANDOM_FUNCTIONS


#: Relative size of ``--perturb``'s change: two fp32 rounding steps (2 * 2**-23), each
#: parameter element moved up or down (a fixed pattern).
PERTURBATION = 2.0**-22


def perturb_parameters_on_setup():
    """Every model's floating-point parameters move by ``PERTURBATION`` (relative, signs from
    a fixed generator) as the model is registered with the backend, before any step.
    Returns the hook's handle."""
    import torch

    from cstorch.backend import run_hooks

    signs = torch.Generator().manual_seed(12345)

    def perturb(model):
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.is_floating_point():
                    sign = torch.randint(0, 2, parameter.shape, generator=signs) * 2 - 1
                    parameter.mul_(1 + PERTURBATION * sign.to(parameter.dtype))

    return run_hooks.register_model_hook(perturb)


def serve_every_backend(engine: str, backend: str, float32: bool) -> None:
    """Whatever backend the script asks for, this engine's serves it (``cstorch.config``'s
    ``serve_backend`` and ``engine``); ``float32``: the run is in float32 unless the script
    chooses a precision itself (CSX's default is float16 mixed precision)."""
    import cstorch

    cstorch.config.config.update("engine", engine)
    cstorch.config.config.update("serve_backend", backend)
    if float32:
        cstorch.amp.enable_mixed_precision(False)


def final_state() -> dict:
    """Every registered model's state_dict and optimizer's state, as float64 arrays (an
    optimizer's ``state.<index>`` also under ``names``: the parameter it belongs to)."""
    import cstorch

    impl = cstorch.backend.current_backend_impl(raise_exception=False)
    if impl is None:
        return {}, {}
    state = {}
    parameter_names = {}
    for m, model in enumerate(impl.models):
        for key, tensor in model.state_dict().items():
            array = _numeric(tensor)
            if array is not None:
                state[f"model{m}.{key}"] = array
        for key, parameter in model.named_parameters():
            parameter_names.setdefault(id(parameter), f"model{m}.{key}")
    names = {}
    for o, optimizer in enumerate(impl.optimizer_registry):
        # state_dict() numbers the parameters of every group in order.
        ordered = [p for group in optimizer.param_groups for p in group["params"]]
        for index, entry in optimizer.state_dict()["state"].items():
            if (
                isinstance(index, int)
                and index < len(ordered)
                and id(ordered[index]) in parameter_names
            ):
                names[f"optimizer{o}.state.{index}"] = parameter_names[id(ordered[index])]
            for key, tensor in entry.items():
                array = _numeric(tensor)
                if array is not None:
                    state[f"optimizer{o}.state.{index}.{key}"] = array
    return state, names


def save(path: str, recorder: Recorder, state: dict, names: dict | None = None) -> None:
    arrays = {}
    index = {
        "closures": [],
        "state": [],
        "dtypes": [],
        "random_ops": sorted(recorder.random_ops),
        "precision": recorder.precision,
        "names": names or {},
    }
    for (step, name), value in recorder.values.items():
        index["closures"].append([step, name, f"v{len(arrays)}"])
        index["dtypes"].append(recorder.dtypes.get((step, name), "float32"))
        arrays[f"v{len(arrays)}"] = value
    for name, value in state.items():
        index["state"].append([name, f"v{len(arrays)}"])
        arrays[f"v{len(arrays)}"] = value
    arrays["index"] = np.frombuffer(json.dumps(index).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load(path: str):
    """``(closures, state)``: ``{(step, name): array}`` and ``{name: array}``."""
    closures, state, _ = load_run(path)
    return closures, state


def load_run(path: str):
    """``(closures, state, info)``; ``info`` has ``dtypes`` (``{(step, name): dtype}``),
    ``random_ops`` and ``precision``."""
    with np.load(path, allow_pickle=False) as data:
        index = json.loads(bytes(data["index"]).decode())
        closures = {(step, name): data[key] for step, name, key in index["closures"]}
        state = {name: data[key] for name, key in index["state"]}
    dtypes = index.get("dtypes") or ["float32"] * len(index["closures"])
    info = {
        "dtypes": {
            (step, name): dtype for (step, name, _), dtype in zip(index["closures"], dtypes)
        },
        "random_ops": index.get("random_ops", []),
        "precision": index.get("precision", "float32"),
        "names": index.get("names", {}),
    }
    return closures, state, info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cstorch.parity.record", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--engine", required=True, choices=["eager", "jax"])
    parser.add_argument("--backend", default="cpu", choices=["cpu", "gpu", "csx"])
    parser.add_argument(
        "--float32",
        action="store_true",
        help="float32 unless the script chooses a precision itself",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--perturb",
        action="store_true",
        help="move the parameters by about one rounding step at setup",
    )
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)

    os.environ["CSTORCH_ENGINE"] = options.engine
    import torch

    import cstorch

    # The same seeds on every engine, before the script seeds (or forgets to).
    random.seed(options.seed)
    np.random.seed(options.seed)
    torch.manual_seed(options.seed)
    serve_every_backend(options.engine, options.backend, options.float32)
    recorder = Recorder()
    install(recorder)
    if options.perturb:
        perturb_parameters_on_setup()

    script = os.path.abspath(options.script)
    sys.argv = [script] + list(options.args)
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise
    recorder.note_precision(cstorch.backend.current_backend_impl(raise_exception=False))
    save(options.out, recorder, *final_state())
    return 0


if __name__ == "__main__":
    sys.exit(main())
