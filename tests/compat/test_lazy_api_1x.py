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
    return [(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g,
                                                            dtype=torch.int32))
            for _ in range(n)]


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

    def __init__(self, cbtorch):
        self.model = cbtorch.module(_model())
        self.optimizer = cbtorch.optimizer(
            _PreinitializedSGD(self.model.parameters(), lr=0.1, momentum=0.9))

    def get_state(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def set_state(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class _ToyApplianceRunner:
    """The 1.7 PyTorchCSAppliance pattern, reduced: every per-batch method acts only on the
    first batch; afterwards ``train_forward`` returns the appliance's loss."""

    def __init__(self, cbtorch, model_dir):
        from cerebras_pytorch.core import cb_model as cm

        self.cm, self.cbtorch, self.model_dir = cm, cbtorch, model_dir
        self._model = _ToyModel(cbtorch)
        self._active_mode = "train"
        self._num_batches_processed = 0
        self._initial_state_file = None
        self.losses = {}
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
    import cerebras_pytorch as cbtorch
    from cerebras_pytorch import amp
    from cerebras_pytorch.core import cb_model as cm, modes
    from cerebras_pytorch.pb.stack.autogen_pb2 import AP_DISABLED  # 1.6's place
    from cerebras_pytorch.saver.pt_h5_saver import CerebrasStateDict, PyTorchH5Saver  # noqa
    from cerebras_pytorch.utils import extract_loss
    from cerebras_pytorch.workflow.python.cs_perf_analyzer import locate_csperf_log

    assert modes.TRAIN == "train" and modes.is_valid("eval_all")
    assert AP_DISABLED == 0 and locate_csperf_log(".") is None
    assert extract_loss({"loss": 3}) == 3
    assert not cm.use_cs() and cm.is_master_ordinal() and cm.num_streamers() == 1
    # 2.x names stay cstorch's: the 1.x additions never hide them.
    assert cbtorch.optim is cstorch.optim and issubclass(amp.GradScaler, cstorch.amp.GradScaler)
    with pytest.raises(ValueError, match="pipeline"):
        cbtorch.Session()


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
    import cerebras_pytorch as cbtorch
    from cerebras_pytorch.core import cb_model as cm

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
        torch.testing.assert_close(torch.as_tensor(state["model"][name]), value,
                                   rtol=2e-2, atol=2e-3)


def test_saver_writes_a_checkpoint_only_once_every_piece_arrived(tmp_path):
    from cerebras_pytorch.saver.pt_h5_saver import PyTorchH5Saver

    state = {"model": {"w": torch.arange(3.0)}, "global_step": 7,
             "lr_scheduler": {"lr_lambdas": [{}]}}  # an empty container is a leaf too
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


def test_a_changing_learning_rate_is_refused_before_anything_runs(tmp_path):
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    runner = _ToyApplianceRunner(cbtorch, str(tmp_path))
    runner._lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        runner._model.optimizer._optimizer, lambda step: 1.0 / (1 + step))
    runner._total_steps = 10
    with pytest.raises(NotImplementedError, match="learning rate schedule is not modeled"):
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


def test_saver_takes_only_model_leaves_from_a_pretrained_checkpoint(tmp_path):
    from cerebras_pytorch.saver.pt_h5_saver import PyTorchH5Saver

    source = str(tmp_path / "pretrained.mdl")
    cstorch.save({"model": {"w": torch.ones(2)}, "optimizer": {"m": torch.ones(2)},
                  "global_step": 50}, source)
    out = str(tmp_path / "initial.hdf5")
    PyTorchH5Saver(loaded_checkpoint=source, is_pretrained_checkpoint=True).save(
        out, {"model": {"w": torch.zeros(2)}, "optimizer": {"m": torch.zeros(2)},
              "global_step": 0})
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
            {"runconfig": {}}, lambda: torch.load(self._initial))

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
