"""The backend singleton and the compile() contract."""

import sys

import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.errors import MultipleBackendsError


def test_backend_is_a_singleton():
    assert cstorch.backend() is None
    backend = cstorch.backend("cpu")
    assert cstorch.backend() is backend
    for kind in ("cpu", "CSX"):
        with pytest.raises(RuntimeError, match="Cannot instantiate multiple backends"):
            cstorch.backend(kind)
    assert isinstance(MultipleBackendsError(), RuntimeError)


def test_backend_argument_errors():
    with pytest.raises(TypeError):
        cstorch.backend(None, foo=1)
    with pytest.raises(TypeError):
        cstorch.backend(3)
    with pytest.raises(ValueError, match="CPU, GPU, CSX"):
        cstorch.backend.BackendType.from_str("tpu")
    assert cstorch.backend.BackendType.from_str("cPu") is cstorch.backend.BackendType.CPU
    with pytest.raises(ValueError, match="set_half_dtype"):
        cstorch.backend("cpu", mixed_precision="bfloat16")  # 2.0-2.2 took a bool only
    assert cstorch.backend() is None  # a failed construction leaves no backend behind


@pytest.mark.parametrize("flag, dtype", [(True, torch.bfloat16), (False, torch.float32)])
def test_cpu_backend_mixed_precision_of_releases_2_0_to_2_2(flag, dtype):
    """cstorch.backend("CPU", mixed_precision=True), as the 2.0-2.2 Model Zoo passes it, runs
    the compiled model's forward under autocast (bfloat16, which the zoo sets as the half
    dtype on CPU); False leaves it in float32."""
    cstorch.amp.set_half_dtype(torch.bfloat16)
    with pytest.warns(DeprecationWarning, match="autocast"):
        backend = cstorch.backend("cpu", mixed_precision=flag)
    model = cstorch.compile(torch.nn.Linear(3, 2), backend)
    assert model(torch.ones(1, 3)).dtype == dtype


def test_gpu_backend_without_gpu_raises():
    with pytest.raises(RuntimeError, match="no GPU"):
        cstorch.backend("GPU")


def test_devices_and_use_cs():
    assert cstorch.current_torch_device() == torch.device("cpu")
    assert not cstorch.use_cs()
    with pytest.raises(RuntimeError, match="No active Cerebras backend"):
        with pytest.warns(DeprecationWarning):
            cstorch.current_backend()
    backend = cstorch.backend("CPU")
    assert cstorch.current_torch_device() == torch.device("cpu", 0)
    assert cstorch.current_torch_device() != torch.device("cpu")
    assert backend.is_cpu and not backend.is_csx
    assert str(backend.device) == "CPU"


def test_csx_backend_validates_its_cluster_config():
    from cstorch.distributed import ClusterConfig

    with pytest.raises(ValueError, match="num_csx"):
        cstorch.backend("CSX", cluster_config=ClusterConfig(num_csx=0))
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(num_csx=1))
    assert cstorch.use_cs() and backend.is_csx
    assert cstorch.amp.mixed_precision()  # CSX always trains in mixed precision


def test_cpu_backend_accepts_a_cluster_config_with_a_warning():
    """gigaGPT passes cluster_config to every backend; off CSX it is ignored, and said so."""
    from cstorch.distributed import ClusterConfig

    with pytest.raises(TypeError, match="ClusterConfig"):
        cstorch.backend("CPU", cluster_config={"num_csx": 1})
    with pytest.warns(UserWarning, match="ignores cluster_config") as record:
        backend = cstorch.backend("CPU", cluster_config=ClusterConfig())
    assert backend.is_cpu
    assert record[0].filename == __file__  # the warning points at the caller's line


def test_compile_creates_a_cpu_backend_and_returns_a_function():
    model = torch.nn.Linear(3, 2)
    compiled = cstorch.compile(model)
    assert cstorch.backend().is_cpu
    assert not isinstance(compiled, torch.nn.Module)
    x = torch.randn(4, 3)
    torch.testing.assert_close(compiled(x), model(x))
    assert compiled.device == torch.device("cpu", 0)
    assert callable(compiled.train) and callable(compiled.parameters)
    assert list(compiled.parameters()) == list(model.parameters())
    cstorch.compile(model)  # compiling twice is fine
    with pytest.raises(RuntimeError, match="multiple backends"):
        cstorch.compile(model, "cpu")
    with pytest.raises(TypeError):
        cstorch.compile(model, 3)


def test_an_explicit_backend_after_compile_adopts_the_implicit_one(tmp_path):
    """``cstorch.compile(model)`` before ``cstorch.backend("CPU")``: the user's own backend
    call on the next line used to fail with "already exists" (issue 31, item 5)."""
    model = torch.nn.Linear(3, 2)
    reference = torch.nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    compiled = cstorch.compile(model)  # no backend yet: an implicit CPU backend
    backend = cstorch.backend("CPU", artifact_dir=str(tmp_path))
    assert cstorch.backend() is backend and backend.artifact_dir == str(tmp_path)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    x = torch.randn(4, 3)
    loss = step(x)
    expected = reference(x).square().mean()
    torch.testing.assert_close(loss.clone(), expected.detach())
    with pytest.raises(MultipleBackendsError, match="already exists"):
        cstorch.backend("CPU")  # adopted once: the next one is a second backend


def test_an_implicit_backend_adopts_only_what_it_can_still_change():
    cstorch.compile(torch.nn.Linear(3, 2))
    with pytest.raises(MultipleBackendsError, match="engine"):
        cstorch.backend("CPU", engine="eager" if cstorch.backend().engine == "jax" else "jax")
    assert cstorch.backend().backend_type.name == "CPU"


def test_another_backend_type_after_compile_names_where_the_implicit_one_was_created():
    line = sys._getframe().f_lineno + 1  # the compile on the next line
    cstorch.compile(torch.nn.Linear(3, 2))
    with pytest.raises(MultipleBackendsError) as info:
        cstorch.backend("CSX")
    message = str(info.value)
    assert f'File "{__file__}", line {line}' in message, message
    assert "created a CPU backend" in message
    assert "before the first cstorch.compile" in message


def test_compile_rejects_another_backend_object():
    backend = cstorch.backend("CPU")
    other = object.__new__(type(backend))
    other._impl = object()
    with pytest.raises(RuntimeError, match="different backend"):
        cstorch.compile(torch.nn.Linear(2, 2), other)


def test_compiled_modules_accept_objects_with_apply():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    cstorch.compile(model)
    seen = []

    class Visitor:
        def apply(self, module):
            seen.append(module)

    model.apply(Visitor())
    assert seen == [model]
    with pytest.raises(TypeError, match="Expected a callable"):
        model.apply(42)


def test_train_and_eval_switch_the_backend_mode():
    model = torch.nn.Linear(2, 2)
    compiled = cstorch.compile(model)
    impl = cstorch.backend()._impl
    compiled.eval()
    assert impl.mode == "eval" and not model.training
    compiled.train()
    assert impl.mode == "train" and model.training
