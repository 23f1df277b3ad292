"""The names and flows the real Model Zoo of releases 2.0 to 2.3 uses, without the zoo.

Each test drives what that generation's ``run_cstorch_flow`` (2.0-2.2) or Trainer (2.3) calls,
in the order it calls it, and checks the numbers against eager torch. ``make zoo-generations``
(tools/zoo_generations.py) runs the zoo itself.
"""

import glob
import math
import os
import warnings

import pytest
import torch

import cstorch


class _Net(torch.nn.Module):
    """A small model with a norm layer and biases, so parameter grouping has work to do."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, batch):
        inputs, labels = batch
        logits = self.fc2(torch.relu(self.norm(self.fc1(inputs))))
        return torch.nn.functional.cross_entropy(logits, labels)


def _batches(n=4):
    gen = torch.Generator().manual_seed(3)
    return [
        (torch.randn(5, 6, generator=gen), torch.randint(0, 3, (5,), generator=gen))
        for _ in range(n)
    ]


def _input_fn(params):
    return _batches(params["n"])


def _eager_sgd_losses(steps, lr, weight_decay):
    """Eager torch: SGD whose weight decay applies to the Linear weights only (the groups
    ``configure_param_groups`` makes: biases and norm parameters get none)."""
    torch.manual_seed(0)
    model = _Net()
    decay = [model.fc1.weight, model.fc2.weight]
    rest = [model.fc1.bias, model.norm.weight, model.norm.bias, model.fc2.bias]
    optimizer = torch.optim.SGD(
        [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=lr,
    )
    losses = []
    for batch in _batches()[:steps]:
        loss = model(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _assert_close(got, want, rtol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert math.isclose(g, w, rel_tol=rtol, abs_tol=1e-7), (got, want)


# --------------------------------------------------------------------------------------------
# 2.2 (Release_2.2.x): cerebras.pytorch with the 2.2 run flow's names


def test_release_2_2_run_flow_trains_like_eager_torch(tmp_path):
    from cerebras.pytorch.core import modes

    import cerebras.pytorch as cs
    from cerebras.appliance.run_utils import (
        get_debug_args,
        set_ini,
        update_debug_args_from_keys,
    )

    assert modes.is_valid(modes.TRAIN_AND_EVAL) and not modes.is_valid("fit")
    # debug args as the zoo fills them: protobuf-style attributes, dotted keys, INIs
    debug_args = get_debug_args(None)
    debug_args.debug_usr.compile_coord_resource.memory_bytes = 3 << 30
    _ = debug_args.debug_usr.worker_resource  # reading adds nothing
    update_debug_args_from_keys(debug_args, {"debug_mgr.task_spec": "x"})
    set_ini(debug_args, ws_opt=True)
    assert debug_args == {
        "debug_usr": {"compile_coord_resource": {"memory_bytes": 3 << 30}},
        "debug_mgr": {"task_spec": "x"},
        "ini": {"ws_opt": True},
    }
    with (
        pytest.warns(DeprecationWarning),
        pytest.warns(UserWarning, match="have no effect on this engine and were dropped"),
    ):
        cs_config = cs.utils.CSConfig(
            num_csx=None,
            debug_args=debug_args,
            fabric_type_blacklist=None,
            disable_version_check=True,
        )
    cs_config.precision_opt_level = 2  # as the 2.2 flow sets it; the executor applies it
    cs.amp.set_half_dtype("float16")  # the 2.2 flow sets it on every run, float32 ones too
    with pytest.warns(DeprecationWarning, match="mixed_precision"):
        backend = cs.backend("CPU", artifact_dir=str(tmp_path), mixed_precision=False)
    torch.manual_seed(0)
    model = _Net()
    compiled = cs.compile(model, backend)
    compiled.train()
    optimizer_params = {"optimizer_type": "SGD", "learning_rate": 0.1, "weight_decay": 0.01}
    groups = cs.optim.configure_param_groups(model, optimizer_params)
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    assert [len(g["params"]) for g in groups] == [2, 4]
    optimizer = cs.optim.configure_optimizer(
        optimizer_type=optimizer_params.pop("optimizer_type"), params=groups, **optimizer_params
    )
    lr_scheduler = cs.optim.configure_lr_scheduler(optimizer, 0.1, None)
    with warnings.catch_warnings():  # read as an attribute, as the 2.2 flow does
        warnings.simplefilter("ignore")
        writer = cs.utils.tensorboard.SummaryWriter(log_dir=str(tmp_path / "train"))
    dataloader = cs.utils.data.DataLoader(_input_fn, {"n": 4})

    @cs.trace
    def training_step(batch):
        loss = compiled(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        lr_scheduler.step()
        return loss

    losses = []

    @cs.step_closure
    def record(loss, step):
        losses.append(loss.item())
        executor.writer.add_scalar("loss", loss.item(), step)

    schedule = cs.profiler.schedule(start_step=-1, end_step=-1)
    with cs.profiler.profile(schedule=schedule) as prof, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # cs_config=, writer=
        executor = cs.utils.data.DataExecutor(
            dataloader,
            num_steps=4,
            checkpoint_steps=None,
            cs_config=cs_config,
            writer=writer,
            listeners=[],
            micro_batch_size=None,
        )
        for step, batch in enumerate(executor, start=1):
            record(training_step(batch), step)
    assert prof.op_profiler_json is None  # nothing was profiled on CPU
    assert executor.cs_config is cs_config and cs.backends.csx.precision.optimization_level == 2
    # float32, as in 2.2 (set_half_dtype alone did not put a CPU step in half precision)
    _assert_close(losses, _eager_sgd_losses(4, 0.1, 0.01))


def test_release_2_2_data_executor_refuses_tensor_listeners(tmp_path):
    backend = cstorch.backend("CPU", artifact_dir=str(tmp_path))
    loader = cstorch.utils.data.DataLoader(_input_fn, {"n": 2})
    with pytest.raises(ValueError, match="listener"):
        cstorch.utils.data.DataExecutor(loader, num_steps=1, listeners=[object()])
    del backend


def test_configure_param_groups_learning_rate_scaling():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(5, 4)
            self.decoder = torch.nn.Module()
            self.decoder.dense = torch.nn.Linear(4, 4)

    groups = cstorch.optim.configure_param_groups(
        Model(),
        {"weight_decay": 0.1, "adjust_learning_rate": {"embedding": 0.5, "decoder_kernel": 0.25}},
    )
    summary = sorted(
        (g["weight_decay"], g["adjust_learning_rate"], len(g["params"])) for g in groups
    )
    assert summary == [(0.0, 1.0, 1), (0.1, 0.25, 1), (0.1, 0.5, 1)]
    with pytest.raises(ValueError, match="layer type"):
        cstorch.optim.configure_param_groups(Model(), {"adjust_learning_rate": {"nope": 2.0}})


# --------------------------------------------------------------------------------------------
# 2.3 (Release_2.3.x): the Trainer enters torch's CPU autocast itself


@pytest.mark.parametrize("half", [None, torch.bfloat16])
def test_release_2_3_trainer_step_tracks_eager_torch(tmp_path, half):
    """The step the 2.3 Trainer runs on CPU: float32, or under ``torch.autocast("cpu",
    bfloat16)`` when the config asks for mixed precision. float32 equals eager torch (1e-5);
    bfloat16 tracks it within two bfloat16 units (eager torch's oneDNN kernels and XLA's
    accumulate a bfloat16 matmul differently)."""
    from cerebras.pytorch.core import modes

    import cerebras.pytorch as cs
    from cerebras.appliance.run_utils import get_debug_args  # noqa: F401  (2.2/2.3 place)

    assert modes.get_modes() == ("train", "eval", "train_and_eval", "eval_all", "inference")

    def run(compiled_step):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
        batches = _batches()

        def body(net, opt, inputs, labels):
            with torch.autocast("cpu", dtype=half or torch.float32, enabled=half is not None):
                logits = net(inputs)
                loss = torch.nn.functional.nll_loss(
                    torch.nn.functional.log_softmax(logits, dim=1), labels
                )
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        if not compiled_step:
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            return [body(model, opt, *b).item() for b in batches]
        backend = cs.backend("CPU", artifact_dir=str(tmp_path))
        net = cs.compile(model, backend)
        opt = cs.optim.SGD(net.parameters(), lr=0.5)
        step = cs.trace(lambda inputs, labels: body(net, opt, inputs, labels))
        losses = []
        record = cs.step_closure(lambda loss: losses.append(loss.item()))
        loader = cs.utils.data.DataLoader(lambda: batches)
        for inputs, labels in cs.utils.data.DataExecutor(loader, num_steps=len(batches)):
            record(step(inputs, labels))
        return losses

    eager = run(compiled_step=False)
    _assert_close(run(compiled_step=True), eager, rtol=1e-5 if half is None else 2**-6)


# --------------------------------------------------------------------------------------------
# 2.0 / 2.1 (Release_2.0.x, 2.1.x): the names cerebras_pytorch and cerebras_appliance


def test_release_2_0_and_2_1_names_and_run_flow(tmp_path):
    import cerebras_pytorch.distributed as dist
    import cerebras_pytorch.metrics as metrics
    from cerebras_appliance.environment import appliance_environ
    from cerebras_appliance.errors import ApplianceNanError
    from cerebras_appliance.log import collect_wsc_log_settings, get_level_name  # noqa: F401
    from cerebras_appliance.run_utils import get_debug_args
    from cerebras_appliance.utils.units import convert_byte_unit
    from cerebras_pytorch.core import modes
    from cerebras_pytorch.utils.nest import visit_torch_tensors

    import cerebras.appliance.errors
    import cerebras_pytorch as cs
    from cerebras_pytorch.saver.pt_h5_saver import PyTorchH5Saver

    # the old name's modules are the new name's (one class, one environment)
    assert ApplianceNanError is cerebras.appliance.errors.ApplianceNanError
    assert issubclass(ApplianceNanError, Exception)
    assert convert_byte_unit(1, "GB", src_unit="GB") == 1
    appliance_environ["ZOO_GENERATIONS_TEST"] = "1"
    assert os.environ.pop("ZOO_GENERATIONS_TEST") == "1"
    del appliance_environ["ZOO_GENERATIONS_TEST"]
    assert get_debug_args(None) == {} and modes.EVAL_ALL == "eval_all"
    assert (dist.num_streamers(), dist.is_streamer(), dist.is_master_ordinal()) == (1, True, True)

    cs.amp.use_bfloat16(False)  # the 2.0 flow's half-dtype call; float32 run here
    assert cs.amp.get_half_dtype() == torch.float16 and not cs.amp.mixed_precision()
    with pytest.warns(DeprecationWarning, match="mixed_precision"):
        backend = cs.backend("CPU", max_checkpoints=1, mixed_precision=False)
    backend.artifact_dir = str(tmp_path)
    torch.manual_seed(0)
    model = _Net()
    compiled = cs.compile(model, backend)
    groups = cs.optim.configure_param_groups(model, {"weight_decay": 0.01})
    optimizer = cs.optim.configure_optimizer(
        "SGD", params=groups, learning_rate=0.1, weight_decay=0.01
    )
    accuracy = metrics.AccuracyMetric(name="accuracy")

    @cs.trace
    def training_step(batch):
        loss = compiled(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    losses, seen = [], []

    @cs.step_closure
    def record(loss):
        visit_torch_tensors(loss, lambda t, scope: seen.append(scope))
        losses.append(loss.item())

    @cs.checkpoint_closure
    def save_checkpoint(step):
        cs.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
            str(tmp_path / f"checkpoint_{step}.mdl"),
        )

    executor = cs.utils.data.DataExecutor(
        cs.utils.data.DataLoader(_input_fn, {"n": 4}), num_steps=4, checkpoint_steps=2
    )
    for step, batch in enumerate(executor, start=1):
        record(training_step(batch))
        if step % 2 == 0:
            save_checkpoint(step)
    with pytest.warns(DeprecationWarning):
        assert executor.profiler.total_samples() == 20
        assert executor.profiler.total_time() > 0
    _assert_close(losses, _eager_sgd_losses(4, 0.1, 0.01))

    # max_checkpoints=1: only the newest checkpoint is kept
    kept = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "checkpoint_*.mdl")))
    assert kept == ["checkpoint_4.mdl"]
    path = str(tmp_path / "checkpoint_4.mdl")
    assert PyTorchH5Saver.is_valid_checkpoint(path)
    assert not PyTorchH5Saver.is_valid_checkpoint(str(tmp_path / "nothing.mdl"))
    version = cs.saver.PyTorchH5Saver.extract_version(path)
    assert version.ckpt_version == 0.5 and version.cstorch_version
    assert PyTorchH5Saver.extract_version(str(tmp_path / "nothing.mdl")) is None
    state = PyTorchH5Saver().load(path)
    assert torch.equal(state["model"]["fc1.weight"], model.state_dict()["fc1.weight"])
    flat, _ = PyTorchH5Saver().flatten_state_dict(state)
    assert "model.fc1.weight" in flat
    with pytest.raises(NotImplementedError, match="cstorch.save"):
        PyTorchH5Saver().save_tensor(path, "x", torch.ones(1))

    # eval with a metric, then the 2.0/2.1 helper that collects every metric's value
    compiled.eval()

    @cs.trace
    def eval_step(batch):
        inputs, labels = batch
        accuracy(
            labels=labels,
            predictions=model.fc2(torch.relu(model.norm(model.fc1(inputs)))).argmax(-1),
        )
        return compiled(batch)

    eval_executor = cs.utils.data.DataExecutor(
        cs.utils.data.DataLoader(_input_fn, {"n": 2}), num_steps=2
    )
    for batch in eval_executor:
        eval_step(batch)
    values = metrics.compute_all_metrics()
    assert list(values) == ["accuracy"] and 0.0 <= float(values["accuracy"]) <= 1.0


def test_release_2_0_csx_backend_keywords(tmp_path):
    """The 2.0/2.1 CSX backend keywords land on today's flags; the device's ``config``."""
    import cerebras_pytorch as cs

    backend = cs.backend(
        "CSX",
        artifact_dir=str(tmp_path),
        drop_data=True,
        max_checkpoints=2,
        use_cs_grad_accum=True,
        micro_batch_size=None,
        retrace_every_iteration=False,
    )
    assert cs.backends.csx.debug.drop_data is True
    backend.device.config.lazy_initialization = False
    assert cs.backends.csx.debug.lazy_initialization is False


def test_old_cpu_backend_keywords_are_checked():
    with pytest.raises(ValueError, match="max_checkpoints"):
        cstorch.backend("CPU", max_checkpoints=0)
    with pytest.raises(TypeError, match="CSX backend setting"):
        cstorch.backend("CPU", micro_batch_size=2)
    with pytest.raises(ValueError, match="bool"):
        cstorch.amp.use_bfloat16("yes")
