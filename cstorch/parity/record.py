"""One engine's side of a parity run: runs an unchanged cstorch script and records it.

``python -m cstorch.parity.record --engine eager|jax --platform cpu|gpu --out FILE
script.py [args...]`` runs the script in this process (as ``__main__``) with the engine chosen
through ``CSTORCH_ENGINE``, records every value passed to a step or checkpoint closure (by
step, closure and argument name) and, at the end, every model's and optimizer's state, and
writes them to ``FILE`` (an ``.npz`` without pickles plus a JSON index inside it).

``--perturb`` moves every floating-point parameter by about one rounding step
(``PERTURBATION``) as its model is set up: the rerun that shows which final state the engine
cannot reproduce itself (values that follow rounding noise, see ``runner``).
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
        self.random_ops: set = set()  # random ATen ops in the compiled steps (JAX engine)
        self.precision = "float32"  # the compute dtype of the run (mixed precision: half)

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


def install(recorder: Recorder) -> None:
    """Wraps every closure the backend runs, counts steps, and notes the random ops of the
    compiled programs and the run's precision."""
    from cstorch.backend.base_backend import BaseBackend
    from jax_backend import program as program_module

    run_closures, on_batch_end = BaseBackend._run_closures, BaseBackend.on_batch_end
    run_outside = BaseBackend.run_closures_of_a_step_outside_executor

    def recording_run_closures(self, queued):
        recorder.precision = self.precision_policy().compute_dtype or "float32"
        for closure in queued:
            closure.fn = recorder.wrap(closure.fn)
        return run_closures(self, queued)

    def counting_on_batch_end(self):
        recorder.step += 1
        return on_batch_end(self)

    def counting_run_outside(self, first):
        if not self.data_executor_stack:  # a step called outside an executor is a step too
            recorder.step += 1
        return run_outside(self, first)

    original_init = program_module.Program.__init__

    def noting_init(self, captured, *args, **kwargs):
        original_init(self, captured, *args, **kwargs)
        recorder.random_ops.update(random_op_names(captured.graph))

    BaseBackend._run_closures = recording_run_closures
    BaseBackend.on_batch_end = counting_on_batch_end
    BaseBackend.run_closures_of_a_step_outside_executor = counting_run_outside
    program_module.Program.__init__ = noting_init


#: Relative size of ``--perturb``'s change: two fp32 rounding steps (2 * 2**-23), each
#: parameter element moved up or down (a fixed pattern).
PERTURBATION = 2.0 ** -22


def perturb_parameters_on_setup() -> None:
    """Every model's floating-point parameters move by ``PERTURBATION`` (relative, signs from
    a fixed generator) as the backend sets the model up, before any step."""
    import torch

    from cstorch.backend.base_backend import BaseBackend

    setup_model = BaseBackend.setup_model
    signs = torch.Generator().manual_seed(12345)

    def perturbed_setup(self, model, *args, **kwargs):
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.is_floating_point():
                    sign = torch.randint(0, 2, parameter.shape, generator=signs) * 2 - 1
                    parameter.mul_(1 + PERTURBATION * sign.to(parameter.dtype))
        return setup_model(self, model, *args, **kwargs)

    BaseBackend.setup_model = perturbed_setup


def random_op_names(graph) -> list:
    """The random ATen ops of a captured graph (``aten.native_dropout``, ``aten.rand``...)."""
    import operator

    from jax_backend.registry import lookup

    names = set()
    for node in graph.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            try:
                if lookup(node.target).random:
                    names.add(str(node.target).rsplit(".", 1)[0])
            except Exception:  # noqa: BLE001 - an op without a lowering is no random op
                continue
    return sorted(names)


def use_gpu_for_cpu_backend() -> None:
    """Scripts ask for ``cstorch.backend("CPU")``; the GPU engine serves it with JAX on GPU."""
    from cstorch.backend.gpu_backend import GpuBackendImpl

    backend_module = sys.modules["cstorch.backend"]  # (cstorch.backend is also a function)

    class GpuForCpu(GpuBackendImpl):
        """Takes the CPU backend's arguments (the CPU-only ones have no meaning here)."""

        def __init__(self, backend_type, artifact_dir=None, mixed_precision=None, *,
                     engine="auto"):
            super().__init__(backend_type, artifact_dir)

    original = backend_module._impl_class
    backend_module._impl_class = lambda t: GpuForCpu if t.is_cpu else original(t)


def force_engine(engine: str) -> None:
    """The engine under comparison, even where the script names one explicitly."""
    from cstorch.backend import cpu_backend

    cpu_backend.resolve_engine = lambda requested="auto": engine


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
            if isinstance(index, int) and index < len(ordered) and \
                    id(ordered[index]) in parameter_names:
                names[f"optimizer{o}.state.{index}"] = parameter_names[id(ordered[index])]
            for key, tensor in entry.items():
                array = _numeric(tensor)
                if array is not None:
                    state[f"optimizer{o}.state.{index}.{key}"] = array
    return state, names


def save(path: str, recorder: Recorder, state: dict, names: dict | None = None) -> None:
    arrays = {}
    index = {"closures": [], "state": [], "dtypes": [], "random_ops": sorted(recorder.random_ops),
             "precision": recorder.precision, "names": names or {}}
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
    info = {"dtypes": {(step, name): dtype
                       for (step, name, _), dtype in zip(index["closures"], dtypes)},
            "random_ops": index.get("random_ops", []),
            "precision": index.get("precision", "float32"),
            "names": index.get("names", {})}
    return closures, state, info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cstorch.parity.record",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True, choices=["eager", "jax"])
    parser.add_argument("--platform", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--perturb", action="store_true",
                        help="move the parameters by about one rounding step at setup")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)

    os.environ["CSTORCH_ENGINE"] = options.engine
    import torch

    import cstorch  # noqa: F401  (the engine module reads CSTORCH_ENGINE at backend creation)

    # The same seeds on every engine, before the script seeds (or forgets to).
    random.seed(options.seed)
    np.random.seed(options.seed)
    torch.manual_seed(options.seed)
    if options.platform == "gpu":
        use_gpu_for_cpu_backend()
    else:
        force_engine(options.engine)
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
    save(options.out, recorder, *final_state())
    return 0


if __name__ == "__main__":
    sys.exit(main())
