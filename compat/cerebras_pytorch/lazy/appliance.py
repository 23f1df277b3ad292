"""``cbtorch.core.appliance.ApplianceMode`` and ``cbtorch.state()``: running the 1.x
appliance runner's traced iteration as one compiled cstorch step.

The 1.x runner (``PyTorchCSAppliance``) calls its per-batch methods for real only on the
first batch: ``optimizer_zero_grad``, ``train_forward``, ``backward``, ``optimizer_step``,
``lr_scheduler_step`` (eval: ``eval_forward``). Then it asks the appliance to ``compile`` that
iteration, to ``execute`` the run from the initial state it saved, and, for batch ``n``, to
``receive_activations(n)`` and hand back the loss; on later batches its methods do nothing
but fetch that loss.

Here the first iteration runs eagerly (its effects are discarded: ``execute`` restores the
initial state file, as the appliance started from it), and ``compile`` makes the runner's
per-batch methods the body of one ``cstorch.trace`` step. The body is the same for every
batch (the static-graph rule), so capturing it once is exact. ``receive_activations(n)``
runs that step on batch ``n`` (the batch the runner's ``cbtorch.dataloader`` just handed
out; the appliance's own copy of the input stream would yield the same batches) on the CSX
backend, the modeled wafer, and keeps its loss. ``save_weights`` writes the current state
into the checkpoint the runner announced.

The zoo's weight-streaming metrics (1.7-1.9 ``CBMetric``, e.g. gpt2's accuracy and
perplexity in eval) keep state on the device, updated in place by the step: named with
``cm.set_metric_state_names``, it becomes backend state, started from its value before the
first, eager iteration. Their device outputs (``track_object({"cb_metric": ...})``) are outputs
of the compiled step, and the activation callbacks registered while the step was traced run
after every step, reading those outputs (``run_state.py``).

The runner is the object that creates the ``ApplianceMode`` (its ``self``): the 1.x class
took no runner argument because the lazy tensors carried the graph; here the graph is
re-traced from the runner's methods.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

import torch

import cstorch
from cerebras_pytorch.lazy import _run
from cerebras_pytorch.lazy.run_state import Tracker, run_state
from cstorch.utils.nest import map_torch_tensors, visit_torch_tensors

_STEP_METHODS = (
    "optimizer_zero_grad",
    "train_forward",
    "backward",
    "optimizer_step",
    "eval_forward",
)  # and lr_scheduler_step from 1.7 on


def _in_torch_memory(state):
    """``state`` with each tensor whose memory torch cannot resize (``torch.load`` reads into
    such memory) copied into torch's own. The optimizer keeps loaded tensors themselves, and the
    engine cannot tell such memory from a numpy array's (``torch.from_numpy``), so it would
    write every step's state through to them; the loaded dict is dropped after the restore."""

    def own(_, value):
        if (
            type(value) is torch.Tensor
            and value.device.type == "cpu"
            and value.layout == torch.strided
            and not value.untyped_storage().resizable()
        ):
            return value.clone()
        return value

    return map_torch_tensors(own, state)


class _LearningRates:
    """The run's learning-rate schedule, fed to the compiled step as an input.

    On a CS system the 1.x stack computed each step's learning rate on the device from the
    step counter (the ``cbtorch.optim.lr_scheduler`` classes the zoo configures), and the
    zoo's host scheduler leaves the optimizer's value alone. Here the compiled step takes
    each param group's learning rate as an input, computed on the host per step by the
    zoo's own schedule function (``lr_function``: the device schedule's formula, torch ops
    on a step tensor; a torch ``LambdaLR``: ``base_lr * lambda(step)``), at the run's
    global step: the step counter the scheduler holds when the run starts (0, or the
    resumed checkpoint's step) plus the steps run since, as on the CPU."""

    def __init__(self, runner):
        self.scheduler = getattr(runner, "_lr_scheduler", None)
        self.functions = []
        if self.scheduler is None:
            return
        groups = self.scheduler.optimizer.param_groups
        if callable(getattr(self.scheduler, "lr_function", None)):  # the zoo's schedulers
            self.functions = [self.scheduler.lr_function] * len(groups)
        elif isinstance(self.scheduler, torch.optim.lr_scheduler.LambdaLR):
            self.functions = [
                lambda step, f=f, base=base: base * f(step)
                for f, base in zip(self.scheduler.lr_lambdas, self.scheduler.base_lrs)
            ]
        else:
            raise NotImplementedError(
                f"The learning-rate scheduler {type(self.scheduler).__name__} is not one the "
                "1.x lazy appliance flow can follow (the Model Zoo's schedulers, with their "
                "lr_function, or a torch LambdaLR). Use one of those, or the cstorch flow "
                "(runconfig.experimental_api: True in releases 1.8/1.9)."
            )
        self.start = 0

    def begin(self) -> None:
        """The run starts: its first step takes the schedule at the scheduler's step."""
        if self.functions:
            self.start = max(int(self.scheduler.last_epoch), 0)

    def at(self, steps_run: int):
        """Each param group's learning rate for the run's ``steps_run``-th step (0-based)."""
        if not self.functions:
            return None
        step = torch.tensor(self.start + steps_run)
        return torch.tensor([float(f(step)) for f in self.functions], dtype=torch.float32)

    def apply(self, rates) -> list:
        """Inside the traced step: the param groups read ``rates``; returns the values to
        put back once traced (the host keeps its Python numbers)."""
        if rates is None:
            return []
        groups = self.scheduler.optimizer.param_groups
        before = [group["lr"] for group in groups]
        for i, group in enumerate(groups):
            group["lr"] = rates[i]
        return before

    def restore(self, before) -> None:
        for group, value in zip(self.scheduler.optimizer.param_groups if before else [], before):
            group["lr"] = value


@contextlib.contextmanager
def _scratch_tensor_attributes():
    """A model that keeps a tensor it computes in ``forward`` as a plain attribute (1.6's
    gpt2: ``self.auto_regressive_mask``) leaves a tensor of the trace on the module, which
    has no value after it. On the 1.x stack that was a lazy tensor, recomputed every step
    and read by nothing else: the step's scratch. The attributes a step sets are put back
    to what they were (or removed) once the step is traced; parameters, buffers and
    attributes that are not tensors are left alone."""
    modules = [m for model in _run.current().modules for m in model.modules()]
    before = [{k: v for k, v in vars(m).items() if isinstance(v, torch.Tensor)} for m in modules]
    try:
        yield
    finally:
        for module, kept in zip(modules, before):
            for key, value in list(vars(module).items()):
                if isinstance(value, torch.Tensor) and kept.get(key) is not value:
                    if key in kept:
                        object.__setattr__(module, key, kept[key])
                    else:
                        delattr(module, key)


def _batch_size(batch) -> int:
    for _, tensor in visit_torch_tensors(batch):
        return int(tensor.shape[0]) if tensor.dim() else 1
    return 0


def _hyperparameters_as_constants() -> None:
    """The 1.8/1.9 zoo optimizers turn their param groups' numbers into 0-d tensors (device
    values on a CS system) and read some in Python (``if nesterov:``), which a lazy XLA
    tensor allowed at a cost and a traced step here cannot. Every hyperparameter is
    constant over a run in this flow but the learning rate, which the step takes as an input
    where it is scheduled (``_LearningRates``), so they go back to Python numbers."""

    def as_number(value):
        if isinstance(value, torch.Tensor) and value.dim() == 0:
            return value.item()
        if isinstance(value, (tuple, list)):  # AdamW's betas: a pair of 0-d tensors
            return type(value)(as_number(v) for v in value)
        return value

    for wrapper in _run.current().optimizers:
        for group in wrapper.param_groups:
            for key, value in list(group.items()):
                if key != "params":
                    group[key] = as_number(value)


class _SameName(dict):
    """1.6's weight-name table: here a weight's tensor name is its own name."""

    def get(self, name, default=None):
        return name

    def __getitem__(self, name):
        return name


class ApplianceMode:
    def __init__(self, *args, **kwargs):
        runner = sys._getframe(1).f_locals.get("self")
        if runner is None or not all(hasattr(runner, m) for m in _STEP_METHODS):
            raise RuntimeError(
                "ApplianceMode must be created by a Model Zoo 1.x appliance runner (its "
                "per-batch methods are the step this engine compiles); create it from the "
                "runner's __init__ as PyTorchCSAppliance does."
            )
        if not _run.current().appliance:
            raise RuntimeError("ApplianceMode needs cbtorch.initialize(appliance=True, ...) first.")
        from cerebras_appliance.CSConfig import CSConfig

        cs_config = kwargs.get("cs_config")
        if cs_config is None:
            cs_config = next((a for a in args if isinstance(a, CSConfig)), None)
        self.cs_config = cs_config if cs_config is not None else CSConfig()
        # 1.6: ApplianceMode(params, load_and_return_state): the runner hands over a function
        # returning the initial state instead of an initial state file.
        self._load_initial_state = next((a for a in args if callable(a)), None)
        self.output_names = ["loss"]  # 1.6 reads the step's activations by these names
        self.weight_names = _SameName()  # and maps weight names to tensor names through this
        self._cs_config = self.cs_config
        self.tracker_execute = Tracker()
        self._runner = runner
        from cerebras_pytorch.lazy.cb_model import RateTracker

        self.throughput = RateTracker()  # samples/s of the steps run (cm._extract_tracker_details)
        self.last_batch_size = 0
        self._step = None
        self._rates = None  # the training run's learning-rate schedule (compile)
        self._steps_run = 0
        self.last_loss = None
        # the traced iteration's metric outputs and callbacks, and the last step's values
        self._output_tensors, self._callbacks, self._activations = [], [], []
        self._metric_closures = []  # 1.6: (fn, args, kwargs) queued by the traced iteration
        self._named_outputs = []  # 1.6: (name, traced tensor) of the metrics' outputs
        _run.current().appliance_mode = self

    # ----------------------------------------------------------------- compile, execute
    def compile(self, *args, **kwargs) -> None:
        """Makes the runner's per-batch methods one compiled step (traced on first use)."""
        runner = self._runner
        training = runner._active_mode != "eval"
        self._rates = _LearningRates(runner) if training else None

        if training:
            rates_of_run = self._rates

            @cstorch.trace
            def step(batch, rates=None):
                def iteration():
                    runner.optimizer_zero_grad()
                    loss = runner.train_forward(batch)
                    runner.backward(loss)
                    before = rates_of_run.apply(rates)
                    runner.optimizer_step()
                    if hasattr(runner, "lr_scheduler_step"):  # 1.6: in optimizer_step
                        runner.lr_scheduler_step()
                    rates_of_run.restore(before)
                    return loss

                return self._traced(iteration)
        else:

            @cstorch.trace
            @torch.no_grad()
            def step(batch, rates=None):
                from cerebras_pytorch.lazy.outputs import extract_loss

                return self._traced(lambda: extract_loss(runner.eval_forward(batch)))

        self._step = step

    def _traced(self, iteration):
        """Runs the runner's iteration inside the step being traced; returns its loss and the
        device outputs its metrics hand to the host, which become outputs of the step:

        * 1.7-1.9: the outputs tracked with ``track_object({"cb_metric": ...})``, read by the
          activation callbacks registered during the trace, run after every step (those of
          the first, eager iteration are not);
        * 1.6: a metric (registered with ``register_metric``) passes its outputs to a step
          closure of its own; that closure is queued again after every step with the step's
          values, and the outputs are also named activations (``output_names[1:]``, one per
          metric in registration order, as 1.6's runner reads them)."""
        state, run = run_state(), _run.current()
        state.device_outputs, state.activation_callbacks = [], []
        queued = len(run.closures)
        with _scratch_tensor_attributes():
            loss = iteration()
        new = run.closures[queued:]
        self._metric_closures = [
            c for c in new if c[1] and any(c[1][0] is m for m in state.metrics)
        ]
        run.closures[queued:] = [c for c in new if not any(c is m for m in self._metric_closures)]
        named = []
        for metric in state.metrics:
            for _, args, kwargs in self._metric_closures:
                if args[0] is metric:
                    tensors = [t for _, t in visit_torch_tensors((args[1:], kwargs))]
                    named += [
                        (metric.name if len(tensors) == 1 else f"{metric.name}_{i}", t)
                        for i, t in enumerate(tensors)
                    ]
        self._named_outputs = named
        self.output_names = ["loss"] + [name for name, _ in named]
        self._output_tensors = list(state.device_outputs) + [t for _, t in named]
        self._callbacks = list(state.activation_callbacks)
        return loss, self._output_tensors

    def activation(self, tensor):
        """The last step's value of an output of the traced iteration (the loss for any
        other tensor: what the 1.x runners fetch)."""
        for traced, value in zip(self._output_tensors, self._activations):
            if traced is tensor:
                return value
        return self.last_loss

    def execute(self, *args, initial_checkpoint_file=None, **kwargs) -> None:
        """Starts the run from the initial state the runner saved (the first, eager iteration
        changed the model and optimizer; the appliance never saw that)."""
        if self._step is None:
            raise RuntimeError("execute() before compile().")
        if initial_checkpoint_file is None:
            initial_checkpoint_file = next(
                (a for a in reversed(args) if isinstance(a, str) and os.path.isfile(a)), None
            )
        if initial_checkpoint_file is not None:
            state = cstorch.load(initial_checkpoint_file)
        elif self._load_initial_state is not None:  # 1.6
            state = self._load_initial_state()
            state.pop("metrics", None)
        else:
            raise ValueError(
                "execute() needs the initial state file the runner saved (initial_checkpoint_file)."
            )
        self._runner._model.set_state(_in_torch_memory(state))
        run_state().restore_metric_state()
        _hyperparameters_as_constants()
        if self._rates is not None:
            self._rates.begin()
        self._steps_run = 0

    def receive_activations(self, step_index: int, *args, **kwargs) -> dict:
        """Runs steps until ``step_index`` (0-based) has run; its loss is then available
        (``cbtorch.state().get_activation_for_output``; 1.6 reads the returned
        ``{output name: value}``)."""
        while self._steps_run <= step_index:
            loader = _run.current().dataloader
            if loader is None or loader.current_batch is None:
                raise RuntimeError(
                    "receive_activations: no batch was handed out by a "
                    "cbtorch.dataloader in this run."
                )
            rates = self._rates.at(self._steps_run) if self._rates is not None else None
            loss, outputs = self._step(loader.current_batch, rates)
            self.last_batch_size = _batch_size(loader.current_batch)
            self.throughput.add(self.last_batch_size)
            impl = cstorch.backend()._impl
            self.last_loss = impl.to_cpu(loss).detach().clone()
            self._activations = [impl.to_cpu(v).detach().clone() for v in outputs]
            self._steps_run += 1
            _run.current().run_step += 1
            for callback in self._callbacks:  # the metrics' host parts, once per step
                callback()
            for fn, args, kwargs in self._metric_closures:  # 1.6's, at the next step mark
                run_args, run_kwargs = map_torch_tensors(
                    lambda _, t: self.activation(t), (args, kwargs)
                )
                _run.current().closures.append((fn, run_args, run_kwargs))
        return {
            "loss": self.last_loss,
            **{name: self.activation(t) for name, t in self._named_outputs},
        }

    def receive_weights(self, state_dict, iteration=None, *args, **kwargs) -> dict:
        """1.6: the current value of every tensor of ``state_dict`` by its dotted name below
        the top level (what the runner looks up through ``weight_names``)."""
        self._runner._model.get_state()  # materializes the engine's state
        return {
            ".".join(map(str, scope[1:])): tensor.detach().cpu()
            for scope, tensor in visit_torch_tensors(state_dict)
        }

    # --------------------------------------------------------------------- checkpoints
    def save_weights(
        self, state, file_name, iteration=None, duplicate_params_map=None, *args, **kwargs
    ) -> None:
        """Writes the current values of ``state`` (a state dict, or ``(key, value)`` pairs of
        a flattened one) into ``file_name``, whose spec the runner saved."""
        from cerebras_pytorch.saver.pt_h5_saver import PyTorchH5Saver

        saver = PyTorchH5Saver()
        items = saver.flatten_state_dict(state)[0].items() if isinstance(state, dict) else state
        for key, value in items:
            saver.save_tensor(file_name, key, value)

    @contextlib.contextmanager
    def build_worker_image(self, *args, **kwargs):
        """No worker image: the modeled wafer runs in this process (1.8/1.9 use it as a
        context around compile and execute)."""
        yield

    def save_dataloader_checkpoint(self, *args, **kwargs) -> None:
        """The runner's dataloader is iterated in this process; nothing to save remotely."""

    def done(self, *args, **kwargs) -> None:
        logging.debug("Appliance run done.")
