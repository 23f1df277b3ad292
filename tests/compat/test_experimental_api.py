"""The 1.8/1.9 API (``cerebras_pytorch.experimental``) and the 2.0/2.1 name
(``cerebras_pytorch``): a porting-guide script runs unchanged and trains like eager torch."""

import math
import os
import sys
import warnings

import pytest
import torch

import cstorch
from tests.compat import porting_guide_18
from tests.eager_reference import cosine_decay_lr, linear_lr


def _eager_losses(num_steps):
    """The porting-guide run in eager torch: SGD(momentum, weight decay), Linear then
    CosineDecay learning rates, clipping by norm 1.0 (loss scaling is exact in fp32)."""
    torch.manual_seed(1)
    model = porting_guide_18.MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9, weight_decay=0.001)
    loader = porting_guide_18.input_fn({"batch_size": 16, "seed": 0})
    batches = list(loader)
    losses = []
    for t in range(num_steps):
        lr = linear_lr(t, 0.02, 0.1, 4) if t < 4 else cosine_decay_lr(t - 4, 0.1, 0.01, 8)
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = batches[t % len(batches)]
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses, model


def _max_rel_err(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.mark.slow
def test_porting_guide_script_matches_eager_torch_in_fp32(tmp_path):
    result = porting_guide_18.main(str(tmp_path), backend="CPU", num_steps=12)
    expected, eager_model = _eager_losses(12)
    assert len(result["losses"]) == 12
    assert _max_rel_err(result["losses"], expected) < 1e-4
    # Checkpoints every configure(checkpoint_steps=4) steps, readable by cstorch.load.
    assert [os.path.basename(p) for p in result["checkpoints"]] == [
        "checkpoint_4.mdl",
        "checkpoint_8.mdl",
        "checkpoint_12.mdl",
    ]
    state = cstorch.load(result["checkpoints"][-1])
    assert state["global_step"] == 12
    for name, value in eager_model.state_dict().items():
        torch.testing.assert_close(
            torch.as_tensor(state["model"][name]), value, rtol=1e-4, atol=1e-5
        )
    # The eval pass: the on-system accuracy equals the eager model's accuracy.
    batches = list(porting_guide_18.input_fn({"batch_size": 16, "seed": 0}))
    correct = sum((eager_model(x).argmax(-1) == y).sum().item() for x, y in batches)
    assert result["metrics"]["accuracy"] == pytest.approx(correct / (16 * len(batches)))


@pytest.mark.slow
def test_porting_guide_script_on_the_modeled_wafer(tmp_path):
    """backend="wse_ws" runs on the CSX backend (always mixed precision): the losses follow
    eager fp32 torch to half-precision accuracy."""
    result = porting_guide_18.main(str(tmp_path), backend="wse_ws", num_steps=8)
    assert cstorch.backend().is_csx
    expected, _ = _eager_losses(8)
    assert _max_rel_err(result["losses"], expected) < 1e-2
    assert all(math.isfinite(x) for x in result["eval_losses"])


def test_configure_twice_raises_and_unknown_settings_are_named():
    import cerebras_pytorch.experimental as legacy

    with pytest.raises(TypeError, match="bogus"):
        legacy.configure(bogus=1)
    legacy.configure(model_dir=".")
    with pytest.raises(RuntimeError, match="only be configured once"):
        legacy.configure(model_dir=".")


def test_compile_backend_names(tmp_path):
    import cerebras_pytorch.experimental as legacy

    with pytest.raises(ValueError, match="WSE_WS"):
        legacy.compile(torch.nn.Linear(2, 2), backend="TPU")
    compiled = legacy.compile(torch.nn.Linear(2, 2), backend="CPU")
    assert compiled.backend.is_cpu() and not compiled.backend.is_wse()
    with pytest.raises(RuntimeError, match="one backend per process"):
        legacy.compile(torch.nn.Linear(2, 2), backend="wse_ws")


def test_wse_compiled_parameters_say_where_they_are(tmp_path):
    """On the modeled wafer the parameters stay host tensors, and say so (``cpu``), so
    tensors made "where the model is" work. (1.8's zoo asserts ``"xla"`` here, true on
    PyTorch/XLA; reporting it would break that idiom: tests/zoo/GENERATIONS_1x.md.)"""
    import cerebras_pytorch.experimental as legacy

    legacy.configure(model_dir=str(tmp_path))
    model = torch.nn.Linear(2, 2)
    compiled = legacy.compile(model, backend="WSE_WS")
    assert compiled.backend.is_wse()
    assert cstorch.backend().torch_device.type == "cpu"  # the modeled wafer's memory
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    inputs = torch.ones(1, 2).to(next(model.parameters()).device)
    assert model(inputs).shape == (1, 2)


@pytest.mark.slow
def test_legacy_optimizer_and_scheduler_names_are_translated():
    import cerebras_pytorch.experimental as legacy

    cstorch.backend("CPU")
    params = [torch.nn.Parameter(torch.zeros(2))]
    adam = legacy.optim.configure_optimizer(
        "AdamW",
        params,
        learning_rate=0.01,
        beta1=0.8,
        beta2=0.95,
        weight_decay_rate=0.1,
        eps=1e-6,
        loss_scaling_factor="dynamic",
        max_gradient_norm=1.0,
    )
    group = adam.param_groups[0]
    assert group["betas"] == (0.8, 0.95) and group["weight_decay"] == 0.1
    sgd = legacy.optim.configure_optimizer(
        "SGD",
        [torch.nn.Parameter(torch.zeros(2))],
        learning_rate=0.1,
        momentum=0.9,
        use_nesterov=True,
    )
    assert sgd.param_groups[0]["nesterov"] is True
    scheduler = legacy.optim.configure_lr_scheduler(
        sgd,
        {
            "scheduler": "Exponential",
            "initial_learning_rate": 0.1,
            "decay_steps": 10,
            "decay_rate": 0.5,
        },
    )
    assert scheduler.total_iters == 10
    # The 2.x cstorch.optim still refuses the 1.x names (its own contract).
    with pytest.raises(ValueError, match="weight_decay_rate"):
        cstorch.optim.configure_optimizer("AdamW", params, weight_decay_rate=0.1)


def test_amp_use_bfloat16_sets_the_half_dtype():
    import cerebras_pytorch.experimental as legacy

    legacy.amp.use_bfloat16(True)
    assert cstorch.amp.get_half_dtype_str() == "bfloat16"
    legacy.amp.use_bfloat16(False)
    assert cstorch.amp.get_half_dtype_str() == "float16"


@pytest.mark.slow
def test_summaries_are_written_after_the_step(tmp_path):
    import cerebras_pytorch.experimental as legacy
    from cstorch.utils.tensorboard import SummaryWriter

    compiled = legacy.compile(torch.nn.Linear(3, 1), backend="CPU")

    @legacy.compile_step
    def step(x):
        out = compiled(x).sum()
        legacy.scalar_summary("out", out)
        return out

    written = []

    class Writer:
        def add_scalar(self, name, value, step):
            written.append((name, value, step))

    @legacy.step_closure
    def after(out, step_):
        legacy.save_summaries(Writer(), step_)

    loader = legacy.utils.data.DataLoader(
        lambda: [torch.ones(2, 3), 2 * torch.ones(2, 3)], num_steps=2
    )
    outs = []
    for i, x in enumerate(loader, start=1):
        out = step(x)
        outs.append(out)
        after(out, i)
    assert [(n, s) for n, _, s in written] == [("out", 1), ("out", 2)]
    assert [v for _, v, _ in written] == pytest.approx([float(o) for o in outs])
    assert SummaryWriter  # 1.9: cstorch.utils.tensorboard is reachable
    assert legacy.utils.tensorboard.SummaryWriter is SummaryWriter


def test_cerebras_pytorch_is_cstorch_module_by_module():
    import cerebras_pytorch.optim
    import cerebras_pytorch.utils.data

    import cerebras_pytorch
    import cerebras_pytorch.experimental

    assert cerebras_pytorch.optim is cstorch.optim
    assert cerebras_pytorch.utils.data is cstorch.utils.data
    assert cerebras_pytorch.trace is cstorch.trace
    assert cerebras_pytorch.backend is cstorch.backend
    assert cerebras_pytorch.experimental is sys.modules["cerebras_pytorch.experimental"]
    assert cerebras_pytorch.experimental.configure  # the 1.8 API, not 2.10's experimental
    assert cerebras_pytorch.experimental.Compression is cstorch.experimental.Compression


def test_deprecated_2_0_names(tmp_path):
    import cerebras_pytorch as cstorch20

    backend = cstorch20.backend("CPU", artifact_dir=str(tmp_path))
    model = torch.nn.Linear(4, 1)
    compiled = cstorch20.compile(model, backend)

    @cstorch20.trace
    def step(x):
        return compiled(x).sum()

    events = []

    class Writer:
        def add_scalar(self, name, value, step):
            events.append((name, step))

    loader = cstorch20.utils.data.DataLoader(lambda: [torch.ones(2, 4)] * 3)
    with pytest.warns(DeprecationWarning, match="ClusterConfig"):
        config = cstorch20.utils.CSConfig(num_csx=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        executor = cstorch20.utils.data.DataExecutor(
            loader, num_steps=3, cs_config=config, writer=Writer()
        )
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert any("cluster_config=" in m for m in messages)
    assert any("DataExecutor(writer=...)" in m for m in messages)
    for x in executor:
        step(x)
    with pytest.warns(DeprecationWarning, match="rate_tracker.rate"):
        assert executor.profiler.rate() == executor.profiler.rate_tracker.rate
    with pytest.warns(DeprecationWarning, match="rate_tracker.global_rate"):
        assert executor.profiler.global_rate() == executor.profiler.rate_tracker.global_rate
    assert events == [("avg_samples_per_sec", 3)]
    with pytest.warns(DeprecationWarning, match="torch.manual_seed"):
        cstorch20.manual_seed(3)


@pytest.mark.slow
def test_1_9_executor_checkpoint_closure_and_summarize_scalar(tmp_path):
    import cerebras_pytorch.experimental as legacy

    backend = legacy.backend("CPU", artifact_dir=str(tmp_path))
    model = torch.nn.Linear(3, 1)
    compiled = legacy.compile(model, backend)
    optimizer = legacy.optim.configure_optimizer("SGD", model.parameters(), learning_rate=0.1)

    @legacy.compile_step
    def step(x):
        loss = compiled(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        legacy.summarize_scalar("loss", loss)
        return loss

    saved = []

    @legacy.checkpoint_closure
    def save(step_):
        path = str(tmp_path / f"checkpoint_{step_}.mdl")
        legacy.save({"model": model.state_dict()}, path)
        saved.append(step_)

    written = []

    class Writer:
        def add_scalar(self, name, value, step_):
            written.append((name, step_))

    loader = legacy.utils.data.DataLoader(lambda: [torch.ones(2, 3)] * 4)
    with pytest.warns(DeprecationWarning, match="writer"):
        executor = legacy.utils.data.DataExecutor(
            loader, num_steps=4, checkpoint_steps=2, writer=Writer()
        )
    for i, x in enumerate(executor, start=1):
        step(x)
        save(i)
    assert saved == [2, 4]
    assert [w for w in written if w[0] == "loss"] == [("loss", i) for i in range(1, 5)]


def test_dataloader_num_steps_counts_the_whole_run_and_repeats_the_batches(tmp_path):
    """1.8: ``DataLoader(input_fn, num_steps=N)`` runs N steps (the input's batches repeat);
    with ``max_steps`` too, ``min(num_steps, max_steps)``. A 20-batch input, num_steps=30:
    one pass over the loader gives 30 steps and the checkpoints at 10, 20 and 30."""
    import cerebras_pytorch.experimental as legacy

    legacy.configure(model_dir=str(tmp_path), checkpoint_steps=10)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    compiled = legacy.compile(model, backend="CPU")
    optimizer = legacy.optim.configure_optimizer("SGD", model.parameters(), learning_rate=0.01)
    inputs, targets = torch.randn(40, 2), torch.randn(40, 1)

    def input_fn():
        dataset = torch.utils.data.TensorDataset(inputs, targets)
        return torch.utils.data.DataLoader(dataset, batch_size=2)

    @legacy.compile_step
    def step(x, y):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    seen, saved = [], []

    @legacy.step_closure
    def record(x):
        seen.append(x.clone())

    @legacy.checkpoint_closure
    def save(step_index):
        saved.append(step_index)

    loader = legacy.utils.data.DataLoader(input_fn, num_steps=30)
    assert loader.num_epochs == 1
    for i, (x, y) in enumerate(loader):
        step(x, y)
        record(x)
        save(i + 1)
    assert len(seen) == 30 and saved == [10, 20, 30]
    for i, x in enumerate(seen):  # batch i is the input's batch i % 20
        torch.testing.assert_close(x, inputs[2 * (i % 20) : 2 * (i % 20) + 2])

    capped = legacy.utils.data.DataLoader(input_fn, num_steps=30, max_steps=25)
    assert capped.num_epochs == 1 and capped.steps_per_epoch == 25
    per_epoch = legacy.utils.data.DataLoader(input_fn, num_epochs=2)
    assert per_epoch.num_epochs == 2 and per_epoch.steps_per_epoch == 20


def test_configure_entry_points_validate_arguments_before_needing_a_backend():
    """Bad names are a ValueError naming the valid choices, never a missing-backend error:
    every entry of a schedule is checked before any scheduler (or optimizer) is built."""
    import cerebras_pytorch.experimental as legacy
    from cstorch.errors import NoBackendError

    legacy.configure(model_dir=".")
    assert cstorch.backend() is None
    params = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="Expected one of .*'sgd'"):
        legacy.optim.configure_optimizer("NoSuchOptimizer", params, learning_rate=0.1)
    with pytest.raises(ValueError, match="Invalid lr_scheduler type. Expected one of"):
        legacy.optim.configure_lr_scheduler(None, {"scheduler": "NoSuchDecay", "total_iters": 3})
    good = {
        "scheduler": "Linear",
        "initial_learning_rate": 0.1,
        "end_learning_rate": 0.0,
        "total_iters": 3,
    }
    for configure in (legacy.optim.configure_lr_scheduler, cstorch.optim.configure_lr_scheduler):
        with pytest.raises(ValueError, match="Expected one of .*'linearlr'.*nosuchdecay"):
            configure(None, [good, {"scheduler": "NoSuchDecay", "total_iters": 3}])
        with pytest.raises(ValueError, match="unexpected parameters: \\['bogus'\\]"):
            configure(None, [good, {**good, "bogus": 1}])
    with pytest.raises(ValueError, match="Invalid scheduler type.*NoSuch"):
        cstorch.optim.configure_scheduler(
            None,
            {
                "SequentialLR": {
                    "schedulers": [
                        {
                            "LinearLR": {
                                "initial_learning_rate": 0.1,
                                "end_learning_rate": 0.0,
                                "total_iters": 3,
                            }
                        },
                        {"NoSuch": {}},
                    ]
                }
            },
        )
    with pytest.raises(ValueError, match="main scheduler"):
        cstorch.optim.configure_lr_scheduler(
            None, [{**good, "main_scheduler": "chained"}, {**good, "main_scheduler": "sequential"}]
        )
    # Valid arguments get as far as needing the backend, and say so.
    with pytest.raises(NoBackendError):
        legacy.optim.configure_optimizer("SGD", params, learning_rate=0.1)
