"""The other deferred tensor kinds of cstorch.storage.serializers, the dtype helpers and
``to_deferred`` (saving device-resident state without a torch copy)."""

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.storage import safetensors_format, serializers, utils
from jax_backend import LazyTensor


def test_deferred_safe_tensor_reads_only_its_key(tmp_path):
    path = tmp_path / "weights.safetensors"
    tensors = {
        "a": torch.arange(6.0).reshape(2, 3),
        "b": torch.tensor([1, 2], dtype=torch.int64),
        "c": torch.randn(4).to(torch.bfloat16),
    }
    safetensors_format.write(path, tensors)
    loaded = serializers.DeferredSafeTensor.load_file(path)
    assert set(loaded) == {"a", "b", "c"}
    assert isinstance(loaded["a"], serializers.DeferredTensor)
    assert loaded["a"].shape == (2, 3) and loaded["c"].dtype == torch.bfloat16
    assert not loaded["b"].is_materialized
    torch.testing.assert_close(loaded["a"] * 1, tensors["a"])
    assert torch.equal(loaded["c"].view(torch.int16) * 1, tensors["c"].view(torch.int16))
    with pytest.raises(KeyError, match="no tensor 'zzz'"):
        serializers.DeferredSafeTensor(path, "zzz")


def test_deferred_file_tensor_is_deprecated_and_reads_raw_values(tmp_path):
    path = tmp_path / "raw.bin"
    np.arange(12, dtype=np.float32).tofile(path)
    with pytest.warns(DeprecationWarning):
        tensor = serializers.DeferredFileTensor(path, (3, 4), torch.float32)
    torch.testing.assert_close(tensor + 0, torch.arange(12.0).reshape(3, 4))


def test_deferred_graph_tensor_runs_its_graph():
    graph = """graph(%x : Tensor, %y : Tensor):
      %alpha : int = prim::Constant[value=1]()
      %z : Tensor = aten::add(%x, %y, %alpha)
      return (%z)"""
    x, y = torch.ones(2, 2), torch.full((2, 2), 2.0)
    tensor = serializers.DeferredGraphTensor(graph, [x, y], (2, 2), torch.float32)
    torch.testing.assert_close(tensor * 1, torch.full((2, 2), 3.0))


def test_dtype_helpers_round_trip():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool):
        assert utils.np_to_torch_dtype(utils.torch_to_np_dtype(dtype)) == dtype


def test_to_deferred_saves_device_state_without_a_torch_copy(tmp_path):
    backend = cstorch.backend("CPU")
    model = torch.nn.Linear(3, 2)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)

    @cstorch.trace
    def step(x):
        loss = compiled(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    step(torch.ones(1, 3))
    stale = {"weight": model.weight, "bias": model.bias}  # torch still holds the old values
    deferred = cstorch.storage.to_deferred(stale)
    assert all(isinstance(t, LazyTensor) for t in deferred.values())
    cstorch.save(deferred, str(tmp_path / "ckpt.mdl"))
    loaded = cstorch.load(str(tmp_path / "ckpt.mdl"))
    current = model.state_dict()  # syncs torch from the device
    torch.testing.assert_close(loaded["weight"] * 1, current["weight"])
    torch.testing.assert_close(loaded["bias"] * 1, current["bias"])
