"""Checkpoints of format < 0.5 (releases 1.7-2.0): hex-pickled TreeSpec plus typed datasets.

The files are built here the way the 2.0 saver laid them out; the spec pickle names
``torch.utils._pytree.TreeSpec``/``LeafSpec`` as torch 2.0 did, written without dill or the
reference installed.
"""

import collections
import io
import pickle
import warnings

import h5py
import numpy as np
import pytest
import torch

import cstorch.storage as storage


class _TreeSpec:
    def __init__(self, type, context, children_specs):
        self.type, self.context, self.children_specs = type, context, children_specs


class _LeafSpec(_TreeSpec):
    def __init__(self):
        super().__init__(None, None, [])


class _TorchPickler(pickle._Pickler):
    """Writes our stand-in classes under torch's 2.0-era global names."""

    NAMES = {
        _TreeSpec: b"torch.utils._pytree\nTreeSpec\n",
        _LeafSpec: b"torch.utils._pytree\nLeafSpec\n",
    }

    def save_global(self, obj, name=None):
        if obj in self.NAMES:
            self.write(pickle.GLOBAL + self.NAMES[obj])
            self.memoize(obj)
            return
        super().save_global(obj, name)


def _spec_hex(spec) -> str:
    buffer = io.BytesIO()
    _TorchPickler(buffer, protocol=2).dump(spec)
    return buffer.getvalue().hex()


def _leaf():
    return _LeafSpec()


def write_legacy(path, *, with_missing=False, object_value=torch.float16):
    # {"model": OrderedDict(w, b16), "opt": {"lr": float, "name": str, "none": None, 0: obj,
    #  "steps": [int]}, "full": full tensor, "np": array}
    opt_keys = ["lr", "name", "none", 0, "steps"]
    spec = _TreeSpec(
        dict,
        ["model", "opt", "full", "np"] + (["gone"] if with_missing else []),
        [
            _TreeSpec(collections.OrderedDict, ["w", "b16"], [_leaf(), _leaf()]),
            _TreeSpec(
                dict,
                opt_keys,
                [_leaf(), _leaf(), _leaf(), _leaf(), _TreeSpec(list, None, [_leaf()])],
            ),
            _leaf(),
            _leaf(),
        ]
        + ([_leaf()] if with_missing else []),
    )
    with h5py.File(path, "w") as f:
        f.attrs["__spec__"] = _spec_hex(spec)
        f.attrs["__version__"] = 0.4
        f.attrs["__cstorch_version__"] = "2.0"
        w = f.create_dataset("model.w", data=np.arange(6, dtype=np.float32).reshape(2, 3))
        w.attrs["__H5_TYPE__"] = "TorchTensorH5Type"
        b16 = f.create_dataset(
            "model.b16",
            data=torch.tensor([1.0, -2.0], dtype=torch.bfloat16).view(torch.int16).numpy(),
        )
        b16.attrs["__H5_TYPE__"] = "TorchTensorH5Type"
        b16.attrs["is_bfloat16"] = True
        lr = f.create_dataset("opt.lr", data=np.float64(0.125))
        lr.attrs["__H5_TYPE__"] = "ScalarH5Type"
        name = f.create_dataset("opt.name", data=h5py.Empty("f"))
        name.attrs["__H5_TYPE__"] = "StringH5Type"
        name.attrs["string_value"] = "adam"
        none = f.create_dataset("opt.none", data=h5py.Empty("f"))
        none.attrs["__H5_TYPE__"] = "NoneH5Type"
        obj = f.create_dataset("opt.0", data=h5py.Empty("f"))
        obj.attrs["__H5_TYPE__"] = "ObjectH5Type"
        obj.attrs["object_value"] = pickle.dumps(object_value).hex()
        step = f.create_dataset("opt.steps.0", data=np.int64(10))
        step.attrs["__H5_TYPE__"] = "ScalarH5Type"
        full = f.create_dataset("full", data=h5py.Empty("f4"))
        full.attrs["__H5_TYPE__"] = "FullTensorH5Type"
        full.attrs["shape"] = [2, 2]
        full.attrs["fill_value"] = 3.0
        full.attrs["is_bfloat16"] = False
        arr = f.create_dataset("np", data=np.arange(3, dtype=np.int32))
        arr.attrs["__H5_TYPE__"] = "NumpyArrayH5Type"


def test_legacy_checkpoint_loads(tmp_path):
    path = tmp_path / "legacy.mdl"
    write_legacy(path)
    out = storage.load(path)
    assert list(out) == ["model", "opt", "full", "np"]
    assert type(out["model"]) is collections.OrderedDict
    assert torch.equal(out["model"]["w"], torch.arange(6.0).reshape(2, 3))
    assert out["model"]["b16"].dtype == torch.bfloat16
    assert torch.equal(out["model"]["b16"], torch.tensor([1.0, -2.0], dtype=torch.bfloat16))
    assert out["opt"] == {
        "lr": 0.125,
        "name": "adam",
        "none": None,
        0: torch.float16,
        "steps": [10],
    }
    assert torch.equal(out["full"], torch.full((2, 2), 3.0))
    assert isinstance(out["np"], np.ndarray) and out["np"].tolist() == [0, 1, 2]


def test_legacy_missing_keys_warn_and_load_as_none(tmp_path):
    path = tmp_path / "legacy.mdl"
    write_legacy(path, with_missing=True)
    with pytest.warns(UserWarning, match="missing the following keys"):
        out = storage.load(path)
    assert out["gone"] is None


def test_legacy_objects_follow_the_pickle_policy(tmp_path):
    path = tmp_path / "legacy.mdl"
    write_legacy(path, object_value=collections.Counter)  # a class: fine, on the allow-list
    assert storage.load(path)["opt"][0] is collections.Counter
    path2 = tmp_path / "legacy2.mdl"
    write_legacy(path2, object_value=warnings.warn)
    with pytest.raises(storage.UnsafePickleError, match="warnings.warn"):
        storage.load(path2)
    assert storage.load(path2, unsafe_allow_pickle=True)["opt"][0] is warnings.warn


def test_legacy_map_location_type_is_checked(tmp_path):
    path = tmp_path / "legacy.mdl"
    write_legacy(path)
    with pytest.raises(TypeError, match="map_location"):
        storage.load(path, map_location={"cpu": "cpu"})


def test_hdf5_without_spec_is_rejected(tmp_path):
    path = tmp_path / "foreign.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(3))
    with pytest.raises(RuntimeError, match="does not conform"):
        storage.load(path)
