"""cstorch.backends flags and the small top-level helpers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from cerebras.pytorch.backends import backends

import cerebras.pytorch as cstorch


@pytest.fixture(autouse=True)
def _default_flags(monkeypatch):
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    backends.reset()
    yield
    backends.reset()


# ------------------------------------------------------------------------ flags
@pytest.mark.parametrize(
    "assign,error,match",
    [
        (lambda: setattr(backends.csx, "foo", 1), AttributeError, "has no flag 'foo'"),
        (
            lambda: setattr(backends.csx, "debug", backends.csx._debug()),
            AttributeError,
            "nested flag",
        ),
        (
            lambda: setattr(backends.csx.debug, "drop_data", "yes"),
            TypeError,
            "Expected bool for `drop_data`",
        ),
        (
            lambda: setattr(backends.csx.performance, "transfer_processes", 0),
            ValueError,
            "positive",
        ),
        (lambda: setattr(backends.csx.performance, "transfer_processes", 2.0), TypeError, "int"),
        (
            lambda: setattr(backends.csx.performance, "micro_batch_size", -1),
            ValueError,
            "micro_batch_size",
        ),
        (
            lambda: setattr(backends.csx.performance, "micro_batch_size", "big"),
            ValueError,
            "micro_batch_size",
        ),
        (
            lambda: setattr(backends.csx.performance, "micro_batch_size", {"explore": {"min": 0}}),
            ValueError,
            "micro_batch_size",
        ),
        (lambda: setattr(backends.csx.precision, "optimization_level", 3), ValueError, "range"),
        (
            lambda: setattr(backends.csx.performance, "max_transfer_bytes", 2**31),
            ValueError,
            "max_transfer_bytes",
        ),
        (
            lambda: setattr(backends.csx.debug, "fabric_type_blacklist", ["cs9"]),
            TypeError,
            "fabric_type_blacklist",
        ),
    ],
)
def test_flag_validation(assign, error, match):
    with pytest.raises(error, match=match):
        assign()


def test_valid_flag_values_defaults_and_reset():
    performance = backends.csx.performance
    for value in (None, 8, "auto", "explore", {"explore": {"min": 2, "max": 8}}):
        performance.micro_batch_size = value
        assert performance.micro_batch_size == value
    performance.transfer_processes = 3
    performance.transfer_processes = backends.DEFAULT
    assert performance.transfer_processes == 5
    backends.csx.debug.fabric_type_blacklist = ["cs2"]
    backends.csx.debug.ini = {"ws_opt": 1}
    assert type(backends.csx.debug.ini).__name__ == "INI"
    backends.reset()
    assert backends.csx.debug.fabric_type_blacklist is None and backends.csx.debug.ini == {}
    assert backends.csx.performance.max_transfer_bytes == 256 * 1024 * 1024


def test_flag_group_is_a_context_manager_that_restores_values():
    with backends.csx.debug:
        backends.csx.debug.save_gpv = True
        assert backends.csx.debug.save_gpv is True
    assert backends.csx.debug.save_gpv is False


def test_asdict_load_flags_and_repr():
    backends.csx.precision.optimization_level = 2
    snapshot = backends.asdict()
    assert snapshot["csx"]["precision"] == {"optimization_level": 2}
    assert dict(backends.csx.precision) == {"optimization_level": 2}
    backends.reset()
    backends.load_flags(snapshot)
    assert backends.csx.precision.optimization_level == 2
    with pytest.raises(ValueError):
        backends.csx.load_flags(backends.csx.debug)
    assert repr(backends.csx.precision) == "precision(optimization_level=2)"
    assert repr(backends).startswith("backends(csx=(precision=(optimization_level=2), ")


def test_s3_profile_flag_is_the_aws_profile_variable():
    backends.csx.storage.s3.profile = "team"
    assert os.environ["AWS_PROFILE"] == "team" and backends.csx.storage.s3.profile == "team"
    backends.csx.storage.s3.profile = None
    assert "AWS_PROFILE" not in os.environ


def test_flags_cannot_change_during_a_csx_run(tmp_path):
    cstorch.backend("CSX", artifact_dir=str(tmp_path))
    loader = cstorch.utils.data.DataLoader(lambda: [torch.zeros(1)])
    for _ in cstorch.utils.data.DataExecutor(loader, num_steps=1):
        with pytest.raises(RuntimeError, match="while a run is in progress"):
            backends.csx.debug.save_gpv = True
    backends.csx.debug.save_gpv = True


# ------------------------------------------------------------------------ helpers
def test_factories():
    assert torch.equal(cstorch.full((2,), 3.0), torch.full((2,), 3.0))
    other = torch.zeros(2, 3, dtype=torch.float16)
    assert cstorch.ones_like(other).dtype == torch.float16
    assert cstorch.zeros_like(other, dtype=torch.int32).dtype == torch.int32
    assert cstorch.full_like(other, 7).eq(7).all()
    assert cstorch.zeros((1, 2)).shape == (1, 2) and cstorch.ones(3).sum() == 3
    t = torch.ones(2)
    assert cstorch.make_constant(t) is t


def test_from_numpy_and_to_numpy():
    array = np.arange(3, dtype=np.float32)
    array.setflags(write=False)
    tensor = cstorch.from_numpy(array)
    assert tensor.tolist() == [0, 1, 2] and cstorch.from_numpy(tensor) is tensor
    assert np.array_equal(cstorch.to_numpy(tensor), array) and cstorch.to_numpy(array) is array


def test_stateful_tensor_without_backend_warns():
    with pytest.warns(UserWarning, match="without a backend"):
        t = cstorch.tensor([1.0])
    assert type(t) is torch.Tensor and t.tolist() == [1.0]


def test_stateful_tensor_persists_updates_across_compiled_steps(cpu_backend):
    counter = cstorch.tensor(0.0)
    compiled = cstorch.compile(torch.nn.Identity(), cpu_backend)

    @cstorch.trace
    def step(x):
        counter.add_(compiled(x).sum())
        with pytest.raises(RuntimeError, match="while tracing"):
            cstorch.tensor([1.0])
        return counter * 1

    loader = cstorch.utils.data.DataLoader(lambda: [torch.ones(2)])
    results = [float(step(x)) for x in cstorch.utils.data.DataExecutor(loader, num_steps=3)]
    assert results == [2.0, 4.0, 6.0] and float(counter) == 6.0


def test_name_scope_needs_a_backend_and_debug_names(cpu_backend):
    with cstorch.name_scope("block"):
        pass
    model = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.Sequential(torch.nn.ReLU()))
    assert cstorch.get_debug_name(model[0]) == "Linear"
    cstorch.add_debug_name(model, "net")
    assert [cstorch.get_debug_name(m) for m in model.modules()] == [
        "net",
        "net.0",
        "net.1",
        "net.1.0",
    ]
    cstorch.set_debug_scope("outer")
    cstorch.set_debug_scope(None)


def test_name_scope_without_backend_raises():
    with pytest.raises(RuntimeError, match="No active Cerebras backend"):
        with cstorch.name_scope("x"):
            pass


def test_pol_and_device_annotation(cpu_backend):
    with pytest.raises(ValueError):
        cstorch.pol(level=3)
    with pytest.raises(TypeError):
        cstorch.device_annotation("cpu")
    assert cstorch.current_pol() == 1
    with pytest.warns(UserWarning, match="doesn't have any effect"):
        decorator = cstorch.pol(level=0)

    @decorator
    def inner():
        return cstorch.current_pol()

    assert inner() == 0 and cstorch.current_pol() == 1
    backends.csx.precision.optimization_level = 2
    assert cstorch.current_pol() == 2


def test_annotations_without_backend_are_identity():
    def fn():
        return 1

    with pytest.warns(UserWarning):
        assert cstorch.device_annotation("wafer")(fn) is fn


def test_removed_summary_functions_point_to_summary_writer():
    for name in ("summarize_scalar", "summarize_tensor"):
        with pytest.raises(AttributeError, match="SummaryWriter"):
            getattr(cstorch, name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cstorch.nope


def test_utils_module_attributes():
    # 2.0/2.1's CSConfig is accepted with a warning that names the 2.10 spelling (issue 13).
    with pytest.warns(DeprecationWarning, match="ClusterConfig"):
        config = cstorch.utils.CSConfig(num_csx=2, max_wgt_servers=None)
    assert isinstance(config, cstorch.distributed.ClusterConfig)
    assert (config.num_csx, config.max_wgt_servers) == (2, 0)
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="nope"):
        cstorch.utils.CSConfig(nope=1)
    import sys

    if "cstorch.utils.tensorboard" not in sys.modules:
        # 2.10 raises here; the 2.0-2.2 Model Zoo reads the attribute without importing it
        with pytest.warns(UserWarning, match="must be imported"):
            assert cstorch.utils.tensorboard is sys.modules["cstorch.utils.tensorboard"]
    import cerebras.pytorch.utils.tensorboard  # noqa: F401

    assert cstorch.utils.tensorboard.SummaryWriter


def test_register_decomposition_applies_inside_traces_only(cpu_backend):
    from cstorch.decomp.registry import remove_decomposition

    with pytest.raises(ValueError):
        cstorch.register_decomposition(torch.ops.aten.tanh, device="TPU")

    @cstorch.register_decomposition(torch.ops.aten.tanh.default, device="CPU")
    def tanh_as_identity(x):
        return x * 1

    try:
        with pytest.raises(RuntimeError, match="already been registered"):
            cstorch.register_decomposition(torch.ops.aten.tanh.default, "CPU")(tanh_as_identity)
        compiled = cstorch.compile(torch.nn.Identity(), cpu_backend)

        @cstorch.trace
        def step(x):
            return torch.tanh(compiled(x))

        assert float(step(torch.tensor(2.0))) == 2.0
        assert float(torch.tanh(torch.tensor(2.0))) == pytest.approx(np.tanh(2.0))
    finally:
        remove_decomposition(torch.ops.aten.tanh.default, "CPU")


# ------------------------------------------------------------------------ settings
def test_every_setting_is_checked_where_it_is_declared():
    """Each setting of both layers (``cstorch.config``, ``jax_backend.config``) refuses a
    value of the wrong kind when it is given, in one form naming the setting, the value, its
    source and the rule, and takes its default (issue 49, item 3)."""
    from cstorch import config
    from jax_backend import config as engine_config, host_memory
    from jax_backend.target import ATTENTION

    for layer in (config.config, engine_config.config):
        for setting in layer.describe():
            assert setting.check is not None or setting.choices is not None, setting.name
            with pytest.raises(
                config.SettingError,
                match=(
                    rf"^Invalid {layer.layer} setting {setting.name}=<object object at \w+> "
                    r"\(from config.update\): must be .+\. \S.*\.$"
                ),
            ):
                layer.update(setting.name, object())
            layer.update(setting.name, setting.default)
    assert tuple(host_memory.STEP_MEMORY) == engine_config.cpu_step_memory.choices
    assert ATTENTION == engine_config.attention.choices


@pytest.mark.parametrize(
    "variable, text, rule",
    [
        ("CSTORCH_PROGRESS_SECONDS", "soon", "could not convert string to float"),
        ("CSTORCH_CPU_STEP_MEMORY", "smallest", "must be one of lean, xla, reuse"),
        ("CSTORCH_INIT_TIMEOUT", "0", "must be a positive integer"),
        ("CSTORCH_NUM_PROCESSES", "two", "must be an integer"),
        ("TORCH_NUM_THREADS", "-4", "must be a positive integer"),
    ],
)
def test_an_environment_value_is_checked_as_an_update_is(monkeypatch, variable, text, rule):
    from cstorch import config

    (setting,) = [s for s in config.describe() if s.env_var == variable]
    monkeypatch.setenv(variable, text)
    with pytest.raises(
        config.SettingError,
        match=(
            rf"^Invalid \w+ setting {setting.name}='{text}' \(from the environment variable "
            rf"{variable}\): {rule}"
        ),
    ):
        setting.value  # (reading it checks it)
