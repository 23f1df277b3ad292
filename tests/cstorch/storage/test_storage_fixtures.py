"""cstorch.load on checkpoints written by the reference (cerebras-pytorch 2.10, torch 2.4).

Values are checked against what the fixture README says the files hold, against numbers derived
from the training step, and against the raw datasets read with h5py alone.
"""

import collections
import json

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest
import torch

import cstorch.storage as storage
from cstorch.storage.serializers import DeferredTorchTensor
from tests.reference_data import REFERENCE

KINDS = str(REFERENCE / "kinds.mdl")
ADAMW = str(REFERENCE / "adamw_step1.mdl")


def raw(path, key):
    with h5py.File(path, "r") as f:
        return f[key][...]


def test_kinds_every_leaf():
    out = storage.load(KINDS)
    assert type(out) is dict
    assert list(out.keys()) == [
        "f32",
        "bf16",
        "f16",
        "i64",
        "i32",
        "bool",
        "scalar0d",
        "tied1",
        "tied2",
        "int",
        "float",
        "str",
        "none",
        "tuple",
        "list",
        "nested",
        5,
    ]
    expected_meta = {
        "f32": (torch.float32, (3, 4)),
        "bf16": (torch.bfloat16, (6,)),
        "f16": (torch.float16, (2, 2)),
        "i64": (torch.int64, (5,)),
        "i32": (torch.int32, (3,)),
        "bool": (torch.bool, (2,)),
        "scalar0d": (torch.float32, ()),
        "tied1": (torch.float32, (2, 3)),
    }
    for key, (dtype, shape) in expected_meta.items():
        value = out[key]
        assert isinstance(value, DeferredTorchTensor), key
        assert value.dtype == dtype and tuple(value.shape) == shape, key
    # Values derivable from how the fixture was made.
    assert torch.equal(out["i64"], torch.arange(5))
    assert torch.equal(out["i32"], torch.arange(3, dtype=torch.int32))
    assert torch.equal(out["bool"], torch.tensor([True, False]))
    assert out["scalar0d"].item() == 2.5
    assert torch.equal(out["nested"]["a"]["b"], torch.ones(2))
    # Random values: equal to the raw datasets (bf16 via its int16 bit pattern).
    assert torch.equal(out["f32"], torch.from_numpy(raw(KINDS, "f32")))
    assert torch.equal(out["f16"], torch.from_numpy(raw(KINDS, "f16")))
    assert torch.equal(out["bf16"].view(torch.int16), torch.from_numpy(raw(KINDS, "bf16")))
    assert torch.equal(out["tied1"], torch.from_numpy(raw(KINDS, "tied1")))
    # Ties, scalars, strings, None and containers.
    assert out["tied1"] is out["tied2"]
    assert out["int"] == 7 and type(out["int"]) is int
    assert out["float"] == 0.25 and type(out["float"]) is float
    assert out["str"] == "text"
    assert out["none"] is None
    assert (
        out["tuple"] == (1, 2.0) and type(out["tuple"]) is tuple and type(out["tuple"][1]) is float
    )
    assert out["list"] == [3, "x"] and type(out["list"]) is list
    assert out[5] == "int key" and "5" not in out


def test_adamw_structure_and_values():
    out = storage.load(ADAMW)
    assert list(out) == ["model", "optimizer", "global_step"]
    model = out["model"]
    assert type(model) is collections.OrderedDict
    shapes = {
        "0.weight": (7, 5),
        "0.bias": (7,),
        "1.weight": (7,),
        "1.bias": (7,),
        "2.weight": (2, 7),
        "2.bias": (2,),
    }
    assert {k: tuple(v.shape) for k, v in model.items()} == shapes
    optimizer = out["optimizer"]
    assert list(optimizer) == ["state", "param_groups"]
    assert list(optimizer["state"]) == [0, 1, 2, 3, 4, 5]  # int keys survive
    group = optimizer["param_groups"][0]
    assert group == {
        "lr": 0.001,
        "betas": (0.9, 0.999),
        "eps": 1e-06,
        "weight_decay": 0.0,
        "l2_regularization_rate": 0.0,
        "correct_bias": True,
        "amsgrad": False,
        "params": [0, 1, 2, 3, 4, 5],
    }
    assert type(group["betas"]) is tuple
    # The reference ties leaves by id(): the int 1 and the float 0.0 were each stored once.
    assert out["global_step"] == 1
    param_shapes = list(shapes.values())
    for index, state in optimizer["state"].items():
        assert list(state) == ["exp_avg", "exp_avg_sq", "beta1_power", "beta2_power"]
        assert tuple(state["exp_avg"].shape) == param_shapes[index]
        # One Adam step from zero state: v = (1 - b2) g^2 and m = (1 - b1) g, so v = 0.1 m^2.
        m, v = state["exp_avg"], state["exp_avg_sq"]
        torch.testing.assert_close(v, 0.1 * m * m, rtol=1e-5, atol=1e-8)
        assert state["beta1_power"].item() == pytest.approx(0.9**2, rel=1e-6)
        assert state["beta2_power"].item() == pytest.approx(0.999**2, rel=1e-6)
    # LayerNorm starts at weight 1 / bias 0 and moves by lr in the sign direction of -m.
    for name, start, index in (("1.weight", 1.0, 2), ("1.bias", 0.0, 3)):
        moved = model[name] - start
        torch.testing.assert_close(moved.abs(), torch.full_like(moved, 1e-3), rtol=1e-3, atol=2e-6)
        assert torch.equal(torch.sign(moved), -torch.sign(optimizer["state"][index]["exp_avg"]))


def test_dataset_attributes_win_over_json_metadata(tmp_path):
    # The reference reader merges dataset attributes over the JSON; a file whose JSON dtype
    # disagrees with its dataset is read with the dataset's.
    path = tmp_path / "k.mdl"
    storage.save({"x": torch.arange(4, dtype=torch.int32)}, path)
    with h5py.File(path, "a") as f:
        md = json.loads(f.attrs["x.__metadata__"])
        md["x.__metadata__"]["dtypes"] = ["torch.int32"]
        f.attrs["x.__metadata__"] = json.dumps(md)
        f["x"].attrs["shapes"] = np.array([[4]])
    assert torch.equal(storage.load(path)["x"], torch.arange(4, dtype=torch.int32))


def test_resaving_kinds_reproduces_reference_metadata(tmp_path):
    """Our writer produces the reference's root attributes, byte for byte, for kinds.mdl."""
    loaded = storage.load(KINDS)
    state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in loaded.items()}
    state["tied2"] = state["tied1"]
    path = tmp_path / "again.mdl"
    storage.save(state, path)
    with h5py.File(KINDS, "r") as ref, h5py.File(path, "r") as ours:
        assert sorted(ref.attrs) == sorted(ours.attrs)
        for name in ref.attrs:
            ref_value, our_value = ref.attrs[name], ours.attrs[name]
            assert type(ref_value) is type(our_value), name
            assert np.array_equal(ref_value, our_value), name
        assert sorted(ref) == sorted(ours)
        for key in ref:
            assert ref[key].dtype == ours[key].dtype and ref[key].shape == ours[key].shape
            assert ref[key].compression_opts == ours[key].compression_opts
            assert ref[key]._filters == ours[key]._filters, key
            assert sorted(ref[key].attrs) == sorted(ours[key].attrs)
            for name in ref[key].attrs:
                a, b = ref[key].attrs[name], ours[key].attrs[name]
                assert type(a) is type(b) and getattr(a, "dtype", None) == getattr(b, "dtype", None)
                assert np.array_equal(a, b), (key, name)
            assert np.array_equal(ref[key][...], ours[key][...])


def _nested_spec(key, inner_leaves):
    leaf = {"type": None, "context": None, "children_spec": []}
    inner = {
        "type": "collections.namedtuple",
        "context": "NestedObject",
        "children_spec": [dict(leaf) for _ in range(2)],
    }
    if inner_leaves == 3:  # NestedObject(NestedObject(object, metadata), metadata)
        inner = {
            "type": "collections.namedtuple",
            "context": "NestedObject",
            "children_spec": [inner, dict(leaf)],
        }
    return json.dumps(
        [1, {"type": "builtins.dict", "context": json.dumps([key]), "children_spec": [inner]}]
    )


def write_csx_style(path, other):
    """Entries only the wafer writes: a DeferredFullTensor and an external DeferredObject link."""
    tensor_md = {
        "__TORCH__": True,
        "shapes": [[2, 2]],
        "dtypes": ["torch.float32"],
        "rtfx_dtypes": [11],
        "__TYPE__": "TorchTensorSerializer",
    }
    entries = {
        "full": {
            "__spec__": [{"full": "*"}, _nested_spec("full", 2)],
            "__objects__": ["full.0"],
            "full.0.__metadata__": {
                "shape": [2, 2],
                "dtype": "torch.float32",
                "fill_value": 3.0,
                "__TYPE__": "DeferredFullTensor",
                "__NONE__": True,
            },
            "full.1.__metadata__": tensor_md,
        },
        "link": {
            "__spec__": [{"link": "*"}, _nested_spec("link", 3)],
            "__objects__": ["link.0.0"],
            "link.0.0.__metadata__": {
                "deferred_object_cls": "DeferredObject",
                "path": str(other),
                "key": "w",
                "index": 0,
                "metadata": {},
                "__TYPE__": "DeferredObject",
                "__NONE__": True,
            },
            "link.0.1.__metadata__": {
                "shapes": [[2, 2]],
                "dtypes": ["torch.float32"],
                "__TYPE__": "DeferredTorchTensor",
            },
            "link.1.__metadata__": tensor_md,
        },
    }
    spec = json.dumps(
        [
            1,
            {
                "type": "builtins.dict",
                "context": json.dumps(list(entries)),
                "children_spec": [
                    {"type": None, "context": None, "children_spec": []} for _ in entries
                ],
            },
        ]
    )
    with h5py.File(path, "w") as f:
        f.attrs["__spec__"] = json.dumps([{k: "*" for k in entries}, spec], indent=4)
        f.attrs["__version__"] = 0.5
        f.attrs["__cstorch_version__"] = "2.10.0"
        for key, md in entries.items():
            f.attrs[f"{key}.__metadata__"] = json.dumps(md, indent=4)
        f.attrs["__SUCCESS__"] = True


def test_csx_nested_entries(tmp_path):
    other = tmp_path / "other.mdl"
    storage.save({"w": torch.arange(4.0).reshape(2, 2)}, other)
    path = tmp_path / "csx.mdl"
    write_csx_style(path, other)
    out = storage.load(path)
    assert torch.equal(out["full"], torch.full((2, 2), 3.0))
    assert isinstance(out["link"], DeferredTorchTensor)
    assert torch.equal(out["link"], torch.arange(4.0).reshape(2, 2))


@pytest.mark.slow
def test_model_and_optimizer_restored_from_the_reference_checkpoint_continue_training(tmp_path):
    """adamw_step1.mdl (written by cerebras-pytorch 2.10 after one AdamW step) restores into a
    model and a cstorch AdamW, and the next steps match an eager AdamW started from the same
    loaded state."""
    import copy

    import cerebras.pytorch as cstorch
    from tests import eager_reference as ref

    cstorch.backend._reset_for_tests()
    try:
        checkpoint = cstorch.load(ADAMW)
        backend = cstorch.backend("CPU", artifact_dir=str(tmp_path))
        model = torch.nn.Sequential(
            torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 2)
        )
        model.load_state_dict(checkpoint["model"])
        eager_model = copy.deepcopy(model)
        compiled = cstorch.compile(model, backend)
        optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3)
        optimizer.load_state_dict(checkpoint["optimizer"])

        @cstorch.trace
        def step(x, y):
            loss = torch.nn.functional.mse_loss(compiled(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss

        eager = ref.EagerCstorchAdamW(eager_model.parameters())
        for p, index in zip(eager.params, range(6)):
            saved = checkpoint["optimizer"]["state"][index]
            eager.state[p] = {
                k: saved[k] * 1 for k in ("exp_avg", "exp_avg_sq", "beta1_power", "beta2_power")
            }
        g = torch.Generator().manual_seed(3)
        x = torch.randn(16, 5, generator=g)
        y = x @ torch.randn(5, 2, generator=g)  # a learnable target
        losses, expected = [], []
        for _ in range(20):
            losses.append(step(x, y).item())
            loss = torch.nn.functional.mse_loss(eager_model(x), y)
            eager.zero_grad()
            loss.backward()
            eager.step(1e-3)
            expected.append(loss.item())
        assert losses == pytest.approx(expected, rel=1e-6)
        assert losses[-1] < losses[0]
        for (name, ours), theirs in zip(
            model.state_dict().items(), eager_model.state_dict().values()
        ):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7, msg=name)
    finally:
        cstorch.backend._reset_for_tests()
