"""The 1.6/1.7 lazy API (``import cerebras_pytorch as cbtorch``, ``cbtorch.core.cb_model``)
driven the way the Model Zoo 1.7 appliance runner drives it, by a small runner written here:
the first batch's forward/backward/optimizer step run for real and become the compiled step;
later batches only fetch the loss the appliance computed (``receive_activations``).

The run trains on the modeled wafer (CSX, mixed precision) and is checked against the same
training in eager torch; checkpoints go through the 1.x ``PyTorchH5Saver``.
"""

import os

import pytest
import torch

import cstorch


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _batches(n=6):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g, dtype=torch.int32))
        for _ in range(n)
    ]


def _eager_losses(n):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = []
    for x, y in _batches(n):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y.long())
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out, model


class _PreinitializedSGD(torch.optim.SGD):
    """SGD with its momentum buffers made at construction, as the zoo's CSOptimizer does."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)


class _ToyModel:
    """What the zoo's PyTorchBaseModel offers the runner: the module, optimizer, state."""

    def __init__(self, cbtorch, make=None):
        self.model = cbtorch.module((make or _model)())
        self.optimizer = cbtorch.optimizer(
            _PreinitializedSGD(self.model.parameters(), lr=0.1, momentum=0.9)
        )

    def get_state(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def set_state(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class _ToyApplianceRunner:
    """The 1.7 PyTorchCSAppliance pattern, reduced: every per-batch method acts only on the
    first batch; afterwards ``train_forward`` returns the appliance's loss."""

    def __init__(self, cbtorch, model_dir, make=None):
        from cerebras_pytorch.core import cb_model as cm

        self.cm, self.cbtorch, self.model_dir = cm, cbtorch, model_dir
        self._model = _ToyModel(cbtorch, make)
        self._active_mode = "train"
        self._num_batches_processed = 0
        self._initial_state_file = None
        self.losses = {}
        cm.set_state_names(self._model.get_state())  # as the 1.7-1.9 runners do, then keep going
        self._save_initial_state()  # a step closure: runs at the first step mark
        self._appliance = cbtorch.core.appliance.ApplianceMode({"runconfig": {}})

    def _save_initial_state(self):
        @self.cm.step_closure
        def save():
            from cerebras_pytorch.saver.pt_h5_saver import PyTorchH5Saver

            self._initial_state_file = os.path.join(self.model_dir, "initial_state.hdf5")
            PyTorchH5Saver().save(self._initial_state_file, self._model.get_state())

        save()

    def optimizer_zero_grad(self):
        if self._num_batches_processed == 0:
            self._model.optimizer.zero_grad()

    def train_forward(self, data):
        if self._num_batches_processed == 0:
            x, y = data
            return torch.nn.functional.cross_entropy(self._model.model(x), y)
        self._appliance.receive_activations(self._num_batches_processed)
        return self.cbtorch.state().get_activation_for_output(None)

    def backward(self, loss):
        if self._num_batches_processed == 0:
            loss.backward()

    def optimizer_step(self):
        if self._num_batches_processed == 0:
            self._model.optimizer.step()

    def lr_scheduler_step(self):
        pass

    def eval_forward(self, data):
        raise AssertionError("not used")

    def save_checkpoint(self, step):
        @self.cm.step_closure
        def save():
            from cerebras_pytorch.saver.pt_h5_saver import PyTorchH5Saver

            path = os.path.join(self.model_dir, f"checkpoint_{step}.mdl")
            saver = PyTorchH5Saver()
            flat, spec = saver.flatten_state_dict(self._model.get_state())
            saver.save_spec(path, spec)
            self._appliance.save_weights(flat.items(), path, step - 1)

        save()

    def train(self, loader, steps):
        @self.cm.step_closure
        def record(loss, step):
            self.losses[step] = loss.item()

        for step, data in enumerate(self.cbtorch.dataloader(loader), start=1):
            self.optimizer_zero_grad()
            loss = self.train_forward(data)
            self.backward(loss)
            self.optimizer_step()
            self.lr_scheduler_step()
            if self._num_batches_processed == 0:
                self._appliance.compile(len(data[1]), False)
                self._appliance.execute(None, 4, steps, 0, "train", self._initial_state_file)
                self._appliance.receive_activations(0)
                loss = self.cbtorch.state().get_activation_for_output(loss)
            record(loss, step)
            if step == steps:
                self.save_checkpoint(step)
            self._num_batches_processed += 1
            if step == steps:
                break
        self.cm.run_step_closures()


def test_1x_names_resolve_as_the_zoo_imports_them():
    from cerebras_pytorch.core import cb_model as cm, modes
    from cerebras_pytorch.pb.stack.autogen_pb2 import AP_DISABLED  # 1.6's place
    from cerebras_pytorch.utils import extract_loss

    import cerebras_pytorch as cbtorch
    from cerebras_pytorch import amp
    from cerebras_pytorch.saver.pt_h5_saver import CerebrasStateDict, PyTorchH5Saver  # noqa
    from cerebras_pytorch.workflow.python.cs_perf_analyzer import locate_csperf_log

    assert modes.TRAIN == "train" and modes.is_valid("eval_all")
    assert AP_DISABLED == 0 and locate_csperf_log(".") is None
    assert extract_loss({"loss": 3}) == 3
    assert not cm.use_cs() and cm.is_master_ordinal() and cm.num_streamers() == 1
    # 2.x names stay cstorch's: the 1.x additions never hide them.
    assert cbtorch.optim is cstorch.optim and issubclass(amp.GradScaler, cstorch.amp.GradScaler)
    with pytest.raises(ValueError, match="pipeline"):
        cbtorch.Session()


def test_run_state_takes_the_compiler_hints_the_1x_transformers_set(tmp_path):
    """1.6-1.8's gpt2/t5/bert write stack hints on ``cbtorch.state().full_config`` when they
    build for a CS system; a field no release sets is refused with the known names."""
    import cerebras_pytorch as cbtorch
    from cerebras_appliance.pb.stack.autogen_pb2 import AP_DISABLED

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    config = cbtorch.state().full_config
    config.matching.kernel.inc_pwt_estimate = True
    config.matching.kernel.enable_pipelined_mlm_loss = True
    config.matching.autogen_policy = AP_DISABLED
    assert config.matching.kernel.inc_pwt_estimate is True
    assert config.matching.kernel.no_dcache_spill_splits is False  # the default, unset
    with pytest.raises(AttributeError, match="inc_pwt_estimate"):
        config.matching.kernel.made_up_hint = True


def test_cm_device_is_a_torch_device_tensors_can_be_made_on(tmp_path, caplog):
    """1.x's ``cm.device()`` was ``xm.xla_device()``, a torch device: the zoo's metrics make
    their state with ``torch.tensor(0, device=cm.device())``. The log still names CSX."""
    import logging

    from cerebras_pytorch.core import cb_model as cm

    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)  # a CSX backend
    assert cstorch.backend().device.type == "CSX"
    assert isinstance(cm.device(), torch.device)
    total = torch.tensor(0, dtype=torch.float32, device=cm.device())
    assert float(total + torch.ones(()).to(cm.device())) == 1.0
    with caplog.at_level(logging.INFO):
        cm.print_update(cm.device(), 3, 0.5, "train")
    assert "| Train Device=CSX, Step=3, Loss=0.50000" in caplog.text


def test_run_state_knows_when_the_execution_loop_runs(tmp_path):
    """The 1.x metrics (``CBMetric``) refuse to be created inside the execution loop: the
    loop is the run's ``cbtorch.dataloader`` handing out batches, until it ends or stops."""
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    state = cbtorch.state()
    loader = cbtorch.dataloader([torch.zeros(2), torch.ones(2)])
    assert not state.is_inside_execution_loop
    seen = []
    for _ in loader:
        seen.append(state.is_inside_execution_loop)
    assert seen == [True, True] and not state.is_inside_execution_loop
    for _ in loader:
        break  # a runner leaving the loop early
    import gc

    gc.collect()
    assert not state.is_inside_execution_loop


def test_batches_keep_int32_and_losses_take_int32_targets_while_out(tmp_path):
    """The 1.x zoo hands the device int32 ids and labels (1.9's gpt2 asserts int32); the 1.x
    stack's losses took int32 targets. While a batch is out, nll_loss/cross_entropy widen an
    int32 target; outside the loop torch's own rule holds."""
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    logits = torch.randn(4, 3)
    labels = torch.tensor([0, 2, 1, 0], dtype=torch.int32)
    expected = torch.nn.functional.cross_entropy(logits, labels.long())
    for batch in cbtorch.dataloader([{"labels": labels, "x": torch.ones(2, dtype=torch.half)}]):
        assert batch["labels"].dtype == torch.int32 and batch["x"].dtype == torch.float32
        assert torch.equal(torch.nn.functional.cross_entropy(logits, batch["labels"]), expected)
        assert torch.equal(
            torch.nn.NLLLoss()(logits.log_softmax(1), target=batch["labels"]),
            torch.nn.functional.nll_loss(logits.log_softmax(1), labels.long()),
        )
    with pytest.raises(RuntimeError, match="Long"):
        torch.nn.functional.cross_entropy(logits, labels)


def test_16_metrics_register_with_the_run(tmp_path):
    """1.6's ``CBMetric`` reads ``cbtorch.env().appliance`` and registers itself with
    ``cbtorch.state()`` when built for a CS system."""
    import cerebras_pytorch as cbtorch

    assert cbtorch.env().appliance is False
    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    assert cbtorch.env().appliance is True
    metric = object()
    cbtorch.state().register_metric(metric)
    assert cbtorch.state().metrics == [metric]


def test_1x_schedule_names_only_during_an_appliance_run(tmp_path):
    import cerebras_pytorch as cbtorch

    # 2.x code sees cstorch's classes (ScalePerParamLR is a 2.x class there too) ...
    assert cbtorch.optim.lr_scheduler.ScalePerParamLR is cstorch.optim.lr_scheduler.ScalePerParamLR
    assert not hasattr(cstorch.optim.lr_scheduler, "Constant")
    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    # ... a 1.x appliance run the 1.x ones, with 1.9's four-argument ScalePerParamLR.
    scaled = cbtorch.optim.lr_scheduler.ScalePerParamLR(None, object(), 100, False)
    assert scaled.args[1:] == (100, False)
    assert cbtorch.optim.Optimizer is cstorch.optim.Optimizer
    assert cbtorch.optim.lr_scheduler.LRScheduler is cstorch.optim.lr_scheduler.LRScheduler


def test_step_closure_runs_at_once_off_the_appliance_and_at_the_mark_on_it(tmp_path):
    from cerebras_pytorch.core import cb_model as cm

    import cerebras_pytorch as cbtorch

    seen = []
    closure = cm.step_closure(lambda v: seen.append(v))
    closure(1)
    assert seen == [1]  # a CPU run: at once
    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    assert cm.use_cs() and cm.is_appliance()
    closure(2)
    assert seen == [1]  # queued until the step mark
    cm.mark_step()
    assert seen == [1, 2]


@pytest.mark.slow
def test_appliance_runner_trains_like_eager_torch_and_checkpoints(tmp_path):
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    runner = _ToyApplianceRunner(cbtorch, str(tmp_path))
    runner.train(_batches(), steps=6)
    expected, eager_model = _eager_losses(6)
    got = [runner.losses[s] for s in range(1, 7)]
    # The modeled wafer computes in float16 mixed precision.
    assert got == pytest.approx(expected, rel=2e-2)
    state = cstorch.load(str(tmp_path / "checkpoint_6.mdl"))
    for name, value in eager_model.state_dict().items():
        torch.testing.assert_close(
            torch.as_tensor(state["model"][name]), value, rtol=2e-2, atol=2e-3
        )


def test_saver_writes_a_checkpoint_only_once_every_piece_arrived(tmp_path):
    from cerebras_pytorch.saver.pt_h5_saver import PyTorchH5Saver

    state = {
        "model": {"w": torch.arange(3.0)},
        "global_step": 7,
        "lr_scheduler": {"lr_lambdas": [{}]},
    }  # an empty container is a leaf too
    saver = PyTorchH5Saver()
    flat, spec = saver.flatten_state_dict(state)
    path = str(tmp_path / "c.mdl")
    saver.save_spec(path, spec)
    saver.save_tensor(path, "model.w", flat["model.w"])
    assert not PyTorchH5Saver.is_valid_checkpoint(path)  # not half a checkpoint on disk
    saver.save_tensor(path, "global_step", 7)
    assert PyTorchH5Saver.is_valid_checkpoint(path)
    assert cstorch.load(path)["lr_scheduler"] == {"lr_lambdas": [{}]}
    assert saver.load_tensor(path, "global_step") == 7
    with pytest.raises(NotImplementedError, match="cannot be added to an existing"):
        PyTorchH5Saver().save_tensor(str(tmp_path / "other.mdl"), "model.w", 1)
    with pytest.raises(KeyError, match="not in the spec"):
        saver.save_spec(path, spec)
        saver.save_tensor(path, "model.v", 1)
    # loaded_checkpoint: the leaves the checkpoint holds come from it.
    resumed = PyTorchH5Saver(loaded_checkpoint=path)
    out = str(tmp_path / "initial.hdf5")
    resumed.save(out, {"model": {"w": torch.zeros(3)}, "global_step": 0})
    assert cstorch.load(out)["model"]["w"].tolist() == [0.0, 1.0, 2.0]


class _ZooStyleSchedule(torch.optim.lr_scheduler.LambdaLR):
    """Modelled on the 1.x Model Zoo's schedulers on a CS system: ``lr_function`` gives the
    learning rate itself from a step tensor (the device's formula), and ``step()`` only
    counts, leaving the host optimizer's value alone."""

    def __init__(self, optimizer, rates):
        self.rates = rates
        super().__init__(optimizer, lr_lambda=self.lr_function)

    def lr_function(self, step):
        return torch.tensor(self.rates)[torch.clamp(torch.as_tensor(step), max=len(self.rates) - 1)]

    def get_lr(self):
        return [group["lr"] for group in self.optimizer.param_groups]


def _eager_losses_scheduled(rates):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = []
    for step, (x, y) in enumerate(_batches(len(rates))):
        opt.param_groups[0]["lr"] = rates[step]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y.long())
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


@pytest.mark.parametrize("kind", ["zoo", "lambda"])
def test_a_learning_rate_schedule_is_followed_step_by_step(tmp_path, kind):
    """The compiled step replays the traced iteration; the learning rate of every step
    comes from the schedule (the zoo's ``lr_function``, or ``base_lr * lambda`` of a torch
    LambdaLR), as in eager torch with that schedule."""
    import cerebras_pytorch as cbtorch

    rates = [0.3, 0.2, 0.1, 0.05, 0.0, 0.1]
    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    runner = _ToyApplianceRunner(cbtorch, str(tmp_path))
    torch_opt = runner._model.optimizer._optimizer
    if kind == "zoo":
        runner._lr_scheduler = _ZooStyleSchedule(torch_opt, rates)
    else:  # base lr 0.1
        runner._lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            torch_opt, lambda step: rates[min(step, len(rates) - 1)] / 0.1
        )
    runner.train(_batches(len(rates)), len(rates))
    got = [runner.losses[s] for s in sorted(runner.losses)]
    assert got == pytest.approx(_eager_losses_scheduled(rates), rel=2e-2, abs=1e-3)
    # a constant rate would give other losses from step 2 on: the schedule mattered
    assert got[4:] != pytest.approx(_eager_losses(len(rates))[0][4:], rel=2e-2)


class _ScratchMaskModel(torch.nn.Module):
    """Keeps a tensor it computes in ``forward`` as a plain attribute, as 1.6's gpt2 keeps
    its causal mask (``self.auto_regressive_mask``)."""

    def __init__(self):
        super().__init__()
        self.net = _model()

    def forward(self, x):
        self.scale = torch.ones(x.shape[1]).cumsum(0) / x.shape[1]
        return self.net(x * self.scale)


def test_a_tensor_the_model_keeps_from_forward_is_scratch_of_the_step(tmp_path):
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    runner = _ToyApplianceRunner(cbtorch, str(tmp_path), make=_ScratchMaskModel)
    runner.train(_batches(4), 4)
    eager = _ScratchMaskModel()
    opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    expected = []
    for x, y in _batches(4):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(eager(x), y.long())
        loss.backward()
        opt.step()
        expected.append(loss.item())
    got = [runner.losses[s] for s in sorted(runner.losses)]
    assert got == pytest.approx(expected, rel=2e-2, abs=1e-3)
    # the attribute holds the first, eager iteration's value, a real tensor
    assert torch.equal(runner._model.model.scale, torch.arange(1, 7) / 6)


def test_a_scheduler_the_flow_cannot_follow_is_refused_before_anything_runs(tmp_path):
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    runner = _ToyApplianceRunner(cbtorch, str(tmp_path))
    runner._lr_scheduler = torch.optim.lr_scheduler.StepLR(
        runner._model.optimizer._optimizer, step_size=2
    )
    with pytest.raises(NotImplementedError, match="StepLR is not one"):
        runner._appliance.compile(4, False)


def test_an_optimizer_making_its_state_inside_step_trains_like_eager_torch(tmp_path):
    """torch's own SGD creates its momentum buffers inside its first step(); the engine keeps
    state born in a step (issue 31), so the 1.x flow needs no preinitialized optimizer."""
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    runner = _ToyApplianceRunner(cbtorch, str(tmp_path))
    plain = torch.optim.SGD(runner._model.model.parameters(), lr=0.1, momentum=0.9)
    runner._model.optimizer = cbtorch.optimizer(plain)
    runner.train(_batches(), steps=6)
    expected, _ = _eager_losses(6)
    got = [runner.losses[s] for s in range(1, 7)]
    assert got == pytest.approx(expected, rel=2e-2)  # float16 mixed precision, as above


class _TensorHyperparameterSGD(_PreinitializedSGD):
    """The 1.8 zoo optimizers' habit: after loading a state dict the param groups' numbers
    are 0-d tensors, and ``step`` reads one in Python."""

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for key in [k for k in group if k != "params"]:
                if isinstance(group[key], (int, float)):
                    group[key] = torch.tensor(group[key])

    def step(self, closure=None):
        for group in self.param_groups:
            if group["nesterov"]:  # a Python read of a hyperparameter
                raise AssertionError("nesterov is off")
        return super().step(closure)


def test_tensor_hyperparameters_become_constants_of_the_step(tmp_path):
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    runner = _ToyApplianceRunner(cbtorch, str(tmp_path))
    inner = _TensorHyperparameterSGD(runner._model.model.parameters(), lr=0.1, momentum=0.9)
    runner._model.optimizer = cbtorch.optimizer(inner)
    runner.train(_batches(), steps=4)
    expected, _ = _eager_losses(4)
    assert [runner.losses[s] for s in range(1, 5)] == pytest.approx(expected, rel=2e-2)
    assert inner.param_groups[0]["lr"] == pytest.approx(0.1)


def test_tensor_hyperparameters_in_a_tuple_become_numbers_too(tmp_path):
    """1.8's AdamW keeps ``betas`` as a pair of 0-d tensors after loading its state (values
    of the initial-state file, which a traced step must not read): numbers as well."""
    import cerebras_pytorch as cbtorch
    from cerebras_pytorch.lazy import appliance

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    model = cbtorch.module(_model())
    inner = torch.optim.AdamW(model.parameters(), lr=0.1)
    cbtorch.optimizer(inner)
    inner.param_groups[0].update(
        betas=(torch.tensor(0.5), torch.tensor(0.25)), eps=torch.tensor(1e-8), name="decay"
    )
    appliance._hyperparameters_as_constants()
    group = inner.param_groups[0]
    assert group["betas"] == (0.5, 0.25) and type(group["betas"][0]) is float
    assert group["eps"] == pytest.approx(1e-8) and group["name"] == "decay"


def test_saver_takes_only_model_leaves_from_a_pretrained_checkpoint(tmp_path):
    from cerebras_pytorch.saver.pt_h5_saver import PyTorchH5Saver

    source = str(tmp_path / "pretrained.mdl")
    cstorch.save(
        {"model": {"w": torch.ones(2)}, "optimizer": {"m": torch.ones(2)}, "global_step": 50},
        source,
    )
    out = str(tmp_path / "initial.hdf5")
    PyTorchH5Saver(loaded_checkpoint=source, is_pretrained_checkpoint=True).save(
        out, {"model": {"w": torch.zeros(2)}, "optimizer": {"m": torch.zeros(2)}, "global_step": 0}
    )
    state = cstorch.load(out)
    assert state["model"]["w"].tolist() == [1.0, 1.0]
    assert state["optimizer"]["m"].tolist() == [0.0, 0.0] and state["global_step"] == 0


class _Toy16Runner(_ToyApplianceRunner):
    """The 1.6 protocol: the appliance gets a function returning the initial state (1.6 read
    ``checkpoint_0.mdl``, written with ``cm.save``), ``receive_activations`` returns the
    outputs by name, and checkpoints are the values ``receive_weights`` hands back."""

    def __init__(self, cbtorch, model_dir):
        from cerebras_pytorch.core import cb_model as cm

        self.cm, self.cbtorch, self.model_dir = cm, cbtorch, model_dir
        self._model = _ToyModel(cbtorch)
        self._active_mode = "train"
        self._num_batches_processed = 0
        self.losses = {}
        self._initial = os.path.join(model_dir, "checkpoint_0.mdl")
        cm.save(self._model.get_state(), self._initial)  # 1.x cm.save: a torch pickle
        self._appliance = cbtorch.core.appliance.ApplianceMode(
            {"runconfig": {}}, lambda: torch.load(self._initial)
        )

    def train_forward(self, data):
        if self._num_batches_processed == 0:
            return super().train_forward(data)
        outputs = self._appliance.receive_activations(self._num_batches_processed)
        return [outputs[name] for name in self._appliance.output_names][0]

    def train(self, loader, steps):
        for step, data in enumerate(self.cbtorch.dataloader(loader), start=1):
            self.optimizer_zero_grad()
            loss = self.train_forward(data)
            self.backward(loss)
            self.optimizer_step()
            if self._num_batches_processed == 0:
                self._appliance.compile(len(data[1]), None, False)
                self._appliance.execute(None, 4, steps, 0)  # 1.6: no initial state file
                loss = self._appliance.receive_activations(0)["loss"]
            self.losses[step] = loss.item()
            self._num_batches_processed += 1
            if step == steps:
                break
        state = self._model.get_state()
        weights = self._appliance.receive_weights(state, steps - 1)
        names = self._appliance.weight_names
        return {name: weights[names.get(name)] for name in state["model"]}


def test_16_protocol_trains_like_eager_torch(tmp_path):
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    runner = _Toy16Runner(cbtorch, str(tmp_path))
    weights = runner.train(_batches(), steps=5)
    expected, eager_model = _eager_losses(5)
    assert [runner.losses[s] for s in range(1, 6)] == pytest.approx(expected, rel=2e-2)
    for name, value in eager_model.state_dict().items():
        torch.testing.assert_close(weights[name], value, rtol=2e-2, atol=2e-3)
    assert isinstance(torch.load(str(tmp_path / "checkpoint_0.mdl")), dict)


class _WSMeanLoss:
    """A 1.7-1.9 weight-streaming metric, as the zoo's CBMetric drives one on the appliance:
    its state lives on the device (two 0-d tensors, tracked and named each call, updated in
    place inside the step); its running result is a device output the host fetches through
    an activation callback after every step."""

    def __init__(self, cbtorch, cm, name):
        self.cbtorch, self.cm, self.name = cbtorch, cm, name
        self.num_updates = 0
        self.reset()

    def reset(self):
        self.total = torch.tensor(0, dtype=torch.float32).to(self.cm.device())
        self.count = torch.tensor(0, dtype=torch.float32).to(self.cm.device())
        self.result = None

    def on_device_state_dict(self):
        return {"total": self.total, "count": self.count}

    def __call__(self, loss):
        state = self.cbtorch.state()
        tracked = self.on_device_state_dict()
        state.track_object(tracked)
        self.cm.set_metric_state_names(tracked, self.name)
        self.total.add_(loss.detach())
        self.count.add_(1.0)
        result = self.total / self.count
        state.track_object({"cb_metric": {self.name: [[result], {}]}}, force=True)

        def on_activations_received():
            self.result = float(state.get_activation_for_output(result))
            self.num_updates += 1

        state.register_activation_callback(on_activations_received)


def _start_eval(runner, cbtorch, model_dir, checkpoint):
    """What the 1.x eval runners share: the model restored from ``checkpoint``, eval mode, no
    batch processed yet. Returns ``cm``."""
    from cerebras_pytorch.core import cb_model as cm

    runner.cm, runner.cbtorch, runner.model_dir = cm, cbtorch, model_dir
    runner._model = _ToyModel(cbtorch)
    runner._model.set_state(cstorch.load(checkpoint))
    runner._active_mode = "eval"
    runner._num_batches_processed = 0
    return cm


class _ToyEvalRunner(_ToyApplianceRunner):
    """The 1.7-1.9 appliance runner's eval: ``eval_forward`` runs the model and its metrics
    for real on the first batch only; the initial state file holds the metrics' device state
    (``metrics/<name>``) besides the model's."""

    def __init__(self, cbtorch, model_dir, checkpoint):
        cm = _start_eval(self, cbtorch, model_dir, checkpoint)
        self.metric = _WSMeanLoss(cbtorch, cm, "eval/mean_loss")
        self._initial_state_file = None
        self._loss_tensor = None
        self.losses = {}
        self._save_initial_state()
        self._appliance = cbtorch.core.appliance.ApplianceMode({"runconfig": {}})

    def _save_initial_state(self):
        @self.cm.step_closure
        def save():
            from cerebras_pytorch.saver.pt_h5_saver import PyTorchH5Saver

            self._initial_state_file = os.path.join(self.model_dir, "initial_state.hdf5")
            state = self._model.get_state()
            state["metrics"] = {
                self.metric.name.replace("/", "_"): self.metric.on_device_state_dict()
            }
            PyTorchH5Saver().save(self._initial_state_file, state)

        save()

    def eval_forward(self, data):
        if self._num_batches_processed == 0:
            x, y = data
            loss = torch.nn.functional.cross_entropy(self._model.model(x), y)
            self.metric(loss)
            self._loss_tensor = loss
            self.cbtorch.state().track_object({"loss": loss})
            return loss
        self._appliance.receive_activations(self._num_batches_processed)
        return self.cbtorch.state().get_activation_for_output(self._loss_tensor)

    def evaluate(self, loader, steps):
        @self.cm.step_closure
        def record(loss, step):
            self.losses[step] = loss.item()

        self.metric.reset()  # the runner's reset_all_metrics, before the loop
        with torch.no_grad():
            for step, data in enumerate(self.cbtorch.dataloader(loader), start=1):
                loss = self.eval_forward(data)
                if self._num_batches_processed == 0:
                    self._appliance.compile(len(data[1]), True)
                    self._appliance.execute(
                        None, 4, steps, 0, "eval", initial_checkpoint_file=self._initial_state_file
                    )
                    self._appliance.receive_activations(0)
                    loss = self.cbtorch.state().get_activation_for_output(self._loss_tensor)
                record(loss, step)
                self._num_batches_processed += 1
                if step == steps:
                    break
        self.cm.run_step_closures()


@pytest.mark.slow
@pytest.mark.filterwarnings("error:The memory of state tensor")  # no write-through either
def test_eval_with_device_metrics_matches_eager_torch(tmp_path):
    """The 1.x zoo's gpt2 eval on CSX: the metrics' device state is carried from step to
    step (from the initial state file's values: the first, eager iteration is discarded),
    and each step's device output reaches the host callbacks once per step."""
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    _, eager_model = _eager_losses(3)  # a trained model, checkpointed
    checkpoint = str(tmp_path / "trained.mdl")
    cstorch.save(
        {"model": eager_model.state_dict(), "optimizer": _ToyModel(cbtorch).optimizer.state_dict()},
        checkpoint,
    )
    batches = _batches(4)
    runner = _ToyEvalRunner(cbtorch, str(tmp_path), checkpoint)
    runner.evaluate(batches, steps=4)
    with torch.no_grad():
        expected = [
            float(torch.nn.functional.cross_entropy(eager_model(x), y.long())) for x, y in batches
        ]
    assert [runner.losses[s] for s in range(1, 5)] == pytest.approx(expected, rel=2e-2)
    assert runner.metric.num_updates == 4  # once per step (not for the eager iteration)
    assert runner.metric.result == pytest.approx(sum(expected) / 4, rel=2e-2)


class _WSMeanLoss16:
    """A 1.6 weight-streaming metric: registered with the run when built, device state named
    with ``set_metric_state`` each call, its device result handed to a step closure of its
    own (the host part); 1.6's runner reads that result as one more named output of the
    appliance."""

    def __init__(self, cbtorch, cm, name):
        self.cbtorch, self.cm, self.name = cbtorch, cm, name
        self.num_updates, self.result = 0, None
        cbtorch.state().register_metric(self)
        self.total = torch.tensor(0, dtype=torch.float32, device=cm.device())
        self.count = torch.tensor(0, dtype=torch.float32, device=cm.device())
        self.state_dict = {"total": self.total, "count": self.count}

        @cm.step_closure
        def update_on_host_closure(metric, args, kwargs):
            metric.result = float(args[0])
            metric.num_updates += 1

        self._update_on_host_closure = update_on_host_closure

    def __call__(self, loss):
        self.cbtorch.state().track_object(self.state_dict)
        self.cm.set_metric_state_names(self.state_dict, self.name)
        self.total.add_(loss.detach())
        self.count.add_(1.0)
        self._update_on_host_closure(self, [self.total / self.count], {})


class _Toy16EvalRunner(_Toy16Runner):
    """1.6's appliance eval: the appliance gets a function returning the initial state, each
    step's activations come back by ``output_names`` (the loss first, then one per metric)."""

    def __init__(self, cbtorch, model_dir, checkpoint):
        cm = _start_eval(self, cbtorch, model_dir, checkpoint)
        self.metric = _WSMeanLoss16(cbtorch, cm, "eval/mean_loss")
        self.losses, self.activations = {}, None
        self._initial = os.path.join(model_dir, "checkpoint_0.mdl")
        cm.save(self._model.get_state(), self._initial)
        self._appliance = cbtorch.core.appliance.ApplianceMode(
            {"runconfig": {}}, lambda: torch.load(self._initial)
        )

    def receive(self):
        out = self._appliance.receive_activations(self._num_batches_processed)
        self.activations = [out[name] for name in self._appliance.output_names]
        return self.activations[0]

    def eval_forward(self, data):
        if self._num_batches_processed == 0:
            x, y = data
            loss = torch.nn.functional.cross_entropy(self._model.model(x), y)
            self.metric(loss)
            return loss
        return self.receive()

    def evaluate(self, loader, steps):
        with torch.no_grad():
            for step, data in enumerate(self.cbtorch.dataloader(loader), start=1):
                loss = self.eval_forward(data)
                if self._num_batches_processed == 0:
                    self._appliance.compile(len(data[1]), None, True)
                    self._appliance.execute(None, 4, steps, checkpoint_steps=0)
                    loss = self.receive()
                self.losses[step] = loss.item()
                self._num_batches_processed += 1
                if step == steps:
                    break
        self.cm.run_step_closures()
        # 1.6's compute_eval_metrics: the activations after the loss, one per metric
        assert len(self.cbtorch.state().metrics) == len(self.activations) - 1
        return dict(
            zip([m.name for m in self.cbtorch.state().metrics], map(float, self.activations[1:]))
        )


@pytest.mark.slow
@pytest.mark.filterwarnings("error:The memory of state tensor")
def test_16_eval_with_device_metrics_matches_eager_torch(tmp_path):
    """1.6's protocol for the same: the metric's device result is a named activation of the
    appliance and reaches its step closure with each step's value."""
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    _, eager_model = _eager_losses(3)
    checkpoint = str(tmp_path / "trained.mdl")
    cstorch.save(
        {"model": eager_model.state_dict(), "optimizer": _ToyModel(cbtorch).optimizer.state_dict()},
        checkpoint,
    )
    batches = _batches(4)
    runner = _Toy16EvalRunner(cbtorch, str(tmp_path), checkpoint)
    metrics = runner.evaluate(batches, steps=4)
    with torch.no_grad():
        expected = [
            float(torch.nn.functional.cross_entropy(eager_model(x), y.long())) for x, y in batches
        ]
    assert [runner.losses[s] for s in range(1, 5)] == pytest.approx(expected, rel=2e-2)
    assert runner._appliance.output_names == ["loss", "eval/mean_loss"]
    assert metrics["eval/mean_loss"] == pytest.approx(sum(expected) / 4, rel=2e-2)
    # the host part ran once per step of the run (and once for the eager iteration, whose
    # closure 1.6 queues before the appliance exists), the last time with the last step's value
    assert runner.metric.num_updates == 5 and runner.metric.result == metrics["eval/mean_loss"]
