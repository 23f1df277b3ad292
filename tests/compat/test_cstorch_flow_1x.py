"""The Model Zoo 1.8/1.9 ``run_cstorch_flow`` way of using the project, driven by a small
script written here: the ``cerebras_appliance`` config types it imports, the 1.9 backend with
``max_checkpoints``, a compiled training step on CPU compared with eager torch, and the eval
pieces (``compute_num_steps`` with ``num_steps`` and ``num_epochs``, ``compute_all_metrics``
read as 1.9 and 1.8 read it)."""

import os

import pytest
import torch


def test_appliance_config_types_are_plain_objects_with_protobuf_manners(tmp_path):
    from cerebras_appliance.run_utils import get_debug_args, update_debug_args_with_autogen_policy

    from cerebras_appliance import DEFAULT_COMPILE_DIR
    from cerebras_appliance.appliance_manager import TensorGroup, TensorSendPayload
    from cerebras_appliance.CSConfig import CSConfig
    from cerebras_appliance.pb.stack.autogen_pb2 import AP_DISABLED, AutogenPolicy
    from cerebras_appliance.pb.stack.full_pb2 import FullConfig
    from cerebras_appliance.pb.workflow.appliance.common.common_config_pb2 import (
        DebugArgs,
        ExecutionStrategy,
    )

    assert isinstance(DEFAULT_COMPILE_DIR, str)
    assert AP_DISABLED == AutogenPolicy.Value("AP_DISABLED")
    assert ExecutionStrategy.ES_WEIGHT_STREAMING == 2
    assert ExecutionStrategy.Name(2) == "ES_WEIGHT_STREAMING"
    args = DebugArgs()
    args.debug_ini.frozen_content += "ws_dense_dmatmul: false\n"  # as the 1.7 runner does
    assert args.debug_ini.frozen_content == "ws_dense_dmatmul: false\n"
    assert not DebugArgs().HasField("debug_ini")
    with pytest.raises(AttributeError, match="no field 'debug_inii'"):
        args.debug_inii = 1
    update_debug_args_with_autogen_policy(args, "medium")
    assert "AP_MEDIUM" in args.debug_ini.frozen_content
    with pytest.raises(ValueError, match="'bogus' is not one of"):
        update_debug_args_with_autogen_policy(args, "bogus")
    path = tmp_path / "dbg.json"
    path.write_text('{"debug_ini": {"frozen_content": "x: 1\\n"}}')
    from_file = get_debug_args(str(path))
    assert from_file.debug_ini.frozen_content == "x: 1\n"
    update_debug_args_with_autogen_policy(from_file, "disabled")  # either kind of DebugArgs
    assert from_file.debug_ini.frozen_content == "x: 1\nautogen_policy: AP_DISABLED\n"
    assert CSConfig(debug_args=from_file).debug_args is from_file
    path.write_text("debug_ini { frozen_content: 'x' }")
    with pytest.raises(ValueError, match="not protobuf text format"):
        get_debug_args(str(path))
    config = CSConfig(num_csx=1, max_wgt_servers=2, debug_args=args)
    assert config.num_csx == 1 and config.debug_args is args
    with pytest.raises(ValueError, match="one CS system"):
        CSConfig(num_csx=2)
    assert FullConfig().matching.autogen_policy == 0
    assert TensorGroup([TensorSendPayload("a", "b", None)]).closure is None


def _input_fn(params):
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(4, 5, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(8)
    ]
    return torch.utils.data.DataLoader(data, batch_size=None)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))


class _WithLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = _model()

    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)


def _eager_losses(steps, initial_state):
    model = _WithLoss()
    model.load_state_dict(initial_state)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out = []
    for batch in list(_input_fn({}))[:steps]:
        opt.zero_grad()
        loss = model(batch)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


@pytest.mark.slow
def test_19_training_flow_equals_eager_torch_and_keeps_max_checkpoints(tmp_path):
    # The 1.9 zoo's imports at the top of its runner and run_cstorch_flow.
    from cerebras_pytorch.core import cb_model, modes  # noqa: F401

    import cerebras_pytorch as cbtorch
    import cerebras_pytorch.experimental as cstorch

    assert cbtorch.utils.utils.is_ltc_mlir_mode_enabled() is False
    with pytest.warns(DeprecationWarning, match="CSConfig is deprecated"):
        cs_config = cstorch.utils.CSConfig(num_csx=1)
    backend = cstorch.backend("CPU", max_checkpoints=2)
    with backend.device:
        model = _WithLoss()
    compiled = cstorch.compile(model, backend)
    compiled.train()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = cstorch.optim.configure_optimizer(
        optimizer_type="SGD",
        params=[{"params": list(model.parameters())}],
        learning_rate=0.05,
        momentum=0.9,
        loss_scaling_factor=1.0,
    )

    @cstorch.checkpoint_closure
    def save_checkpoint(step):
        cstorch.save(
            {"model": model.state_dict(), "global_step": step},
            os.path.join(tmp_path, f"checkpoint_{step}.mdl"),
        )

    @cstorch.compile_step
    def training_step(batch):
        loss = compiled(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    losses = []

    @cstorch.step_closure
    def post_training_step(loss):
        losses.append(loss.item())

    dataloader = cstorch.utils.data.DataLoader(_input_fn, {})
    num_steps = cstorch.utils.data.compute_num_steps(dataloader, initial_step=0, max_steps=6)
    with pytest.warns(DeprecationWarning, match="cs_config=.... is deprecated"):
        executor = cstorch.utils.data.DataExecutor(
            dataloader, num_steps=num_steps, checkpoint_steps=2, cs_config=cs_config
        )
    global_step = 0
    for batch in executor:
        loss = training_step(batch)
        global_step += 1
        post_training_step(loss)
        save_checkpoint(global_step)

    expected = _eager_losses(6, initial)
    assert losses[0] == pytest.approx(expected[0], rel=1e-6)  # XLA's float32 vs torch's
    assert losses == pytest.approx(expected, rel=1e-5)
    # max_checkpoints=2: of checkpoints 2, 4 and 6 the two newest are kept.
    assert sorted(p.name for p in tmp_path.glob("checkpoint_*.mdl")) == [
        "checkpoint_4.mdl",
        "checkpoint_6.mdl",
    ]


def test_19_eval_pieces(tmp_path):
    import cerebras_pytorch.experimental as cstorch
    import cerebras_pytorch.experimental.metrics as metrics

    cstorch.backend("CPU")
    dataloader = cstorch.utils.data.DataLoader(_input_fn, {})
    # 1.9's eval passes both: the run stops at whichever limit comes first.
    assert cstorch.utils.data.compute_num_steps(dataloader, num_steps=3, num_epochs=1) == 3
    assert cstorch.utils.data.compute_num_steps(dataloader, num_steps=30, num_epochs=1) == 8
    values = metrics.MetricValues(accuracy=0.5)
    assert dict(values.items()) == {"accuracy": 0.5}  # 1.9: .items()
    assert [(n, v) for n, v in values] == [("accuracy", 0.5)]  # 1.8: pairs
    assert dict(values) == {"accuracy": 0.5}


def test_19_backend_refuses_what_it_cannot_model():
    import cerebras_pytorch.experimental as cstorch

    with pytest.raises(ValueError, match="drop_data"):
        cstorch.backend("CSX", drop_data=True)
    with pytest.raises(ValueError, match="max_checkpoints"):
        cstorch.backend("CPU", max_checkpoints=0)
