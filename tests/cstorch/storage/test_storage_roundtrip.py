"""cstorch.save -> cstorch.load round trips, the on-disk layout, laziness, and error paths."""

import collections
import io
import json
import os
import pickle
import warnings

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest
import torch

import cstorch.storage as storage
from cstorch.storage import safe_pickle, serializers
from cstorch.storage.h5_format import H5Reader
from cstorch.storage.serializers import DeferredTorchTensor

pytestmark = pytest.mark.core

Point = collections.namedtuple("Point", "x y")


class Custom:
    """A user class: pickled on save, refused on load unless the caller opts in."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Custom) and other.value == self.value


def roundtrip(state, tmp_path, name="ckpt.mdl", **load_kwargs):
    path = tmp_path / name
    storage.save(state, path)
    return storage.load(path, **load_kwargs)


# ---------------------------------------------------------------------------------------------
# Leaf kinds: one row per kind (value, check)

TENSORS = {
    "float32": torch.randn(3, 4),
    "bfloat16": torch.randn(5, 7).bfloat16(),
    "float16": torch.randn(2, 2).half(),
    "float64": torch.randn(3).double(),
    "int64": torch.arange(5),
    "int32": torch.arange(3, dtype=torch.int32),
    "int16": torch.arange(3, dtype=torch.int16),
    "uint8": torch.arange(3, dtype=torch.uint8),
    "bool": torch.tensor([True, False, True]),
    "zero_d": torch.tensor(2.5),
    "zero_d_int": torch.tensor(7),
    "empty": torch.zeros(0, 4),
    "non_contiguous": torch.arange(12.0).reshape(3, 4).t(),
    "large": torch.randn(700, 600),  # LZ4 chunks, the last one partial
    "many_chunks": torch.randn(64, 70000),  # read on several threads
    "compressible": torch.zeros(700, 600),  # LZ4 really compresses: read through HDF5
    "mixed": torch.cat([torch.zeros(400, 600), torch.randn(300, 600)]),
}


@pytest.mark.parametrize("name", sorted(TENSORS))
def test_tensor_roundtrip_bit_exact(name, tmp_path):
    value = TENSORS[name]
    out = roundtrip({"t": value}, tmp_path)["t"]
    assert isinstance(out, DeferredTorchTensor)
    assert out.dtype == value.dtype and out.shape == value.shape
    if value.dtype == torch.bfloat16:  # bit patterns, not just values
        assert torch.equal(out.view(torch.int16), value.view(torch.int16))
    assert torch.equal(out, value)


PY_LEAVES = {
    "int": 7,
    "negative_int": -(2**40),
    "float": 0.25,
    "bool_true": True,
    "str": "text",
    "unicode": "héllo ✓",
    "none": None,
    "tuple": (1, 2.0),
    "list": [3, "x", None],
    "nested": {"a": {"b": {"c": 1}}},
    "odict": collections.OrderedDict(z=1, a=2),
    "empty_dict": {},
    "empty_list": [],
    "set": {1, 2, 3},
    "namedtuple": Point(1, 2),
    "defaultdict": collections.defaultdict(list, {"k": 1}),
    "deque": collections.deque([1, 2], maxlen=5),
    "torch_dtype": torch.bfloat16,
    "torch_size": torch.Size([2, 3]),
    "device": torch.device("cpu"),
    "complex": complex(1, 2),
    "bytes": b"\x00ab",
    "frozenset": frozenset([1]),
    "slice": slice(1, 5, 2),
    "range": range(2, 9, 3),
    "np_scalar": np.int64(3),
    "np_float64": np.float64(1.5),
    "np_dtype": np.dtype("float16"),
}


@pytest.mark.parametrize("name", sorted(PY_LEAVES))
def test_python_leaf_roundtrip(name, tmp_path):
    value = PY_LEAVES[name]
    out = roundtrip({"v": value}, tmp_path)["v"]
    # np.float64 subclasses float, so it is a ScalarSerializer leaf and comes back a float.
    expected_type = float if name == "np_float64" else type(value)
    assert out == value and type(out) is expected_type
    if isinstance(value, collections.defaultdict):
        assert out.default_factory is list
    if isinstance(value, collections.deque):
        assert out.maxlen == 5


def test_int_dict_keys_and_mixed_structure(tmp_path):
    t = torch.randn(3)
    state = {
        "a": t,
        "b": t,
        "n": None,
        "e": 7,
        "s": "x",
        "t": (1, 2),
        3: torch.arange(2),
        "optimizer": {"state": {0: {"exp_avg": torch.ones(2)}, 1: {"exp_avg": torch.zeros(2)}}},
    }
    out = roundtrip(state, tmp_path)
    assert list(out) == ["a", "b", "n", "e", "s", "t", 3, "optimizer"]
    assert out["a"] is out["b"]  # tie restored
    assert list(out["optimizer"]["state"]) == [0, 1]
    assert torch.equal(out[3], torch.arange(2))


def test_numpy_arrays(tmp_path):
    arrays = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "i8": np.arange(3, dtype=np.int8),
        "bool": np.array([True, False]),
        "c64": np.array([1 + 2j], dtype=np.complex64),
        "strings": np.array(["a", "bc"]),
        "objects": np.array([1, "x"], dtype=object),
    }
    out = roundtrip(arrays, tmp_path)
    for key, value in arrays.items():
        assert type(out[key]) is np.ndarray and out[key].dtype == value.dtype
        assert np.array_equal(out[key], value), key


def test_numpy_bf16_array(tmp_path):
    bits = np.array([16256, -16512], dtype=np.int16)  # 1.0, -1.0
    tagged = bits.view(np.dtype("i2", metadata={"is_bfloat16": True, "is_cerebras": True}))
    path = tmp_path / "bf.mdl"
    storage.save({"a": tagged}, path)
    with h5py.File(path) as f:
        assert f["a"].dtype == np.int16 and bool(f["a"].attrs["is_bfloat16"])
    out = storage.load(path)["a"]
    assert out.dtype.metadata["is_bfloat16"] and np.array_equal(out.view(np.int16), bits)


def test_custom_object_needs_opt_in(tmp_path):
    path = tmp_path / "obj.mdl"
    storage.save({"obj": Custom(3), "w": torch.ones(2)}, path)
    with pytest.raises(storage.UnsafePickleError) as info:
        storage.load(path)
    message = str(info.value)
    assert "Custom" in message and "unsafe_allow_pickle=True" in message and str(path) in message
    out = storage.load(path, unsafe_allow_pickle=True)
    assert out["obj"] == Custom(3)


def test_restricted_unpickler_refuses_code():
    payloads = [
        pickle.dumps(os.system),
        pickle.dumps(eval),
        pickle.dumps(Custom),
        b"cos\nsystem\n(S'echo pwned'\ntR.",  # the classic protocol-0 exploit
        b"cbuiltins\ngetattr\n.",
    ]
    for payload in payloads:
        with pytest.raises(safe_pickle.UnsafePickleError, match="unsafe_allow_pickle=True"):
            safe_pickle.loads(payload, what="test payload")


# ---------------------------------------------------------------------------------------------
# Structure


def test_namedtuple_registered_by_module(tmp_path):
    out = roundtrip({"p": Point(torch.ones(1), 2)}, tmp_path)
    assert type(out["p"]) is Point and out["p"].y == 2


def test_unresolvable_namedtuple_becomes_tuple_with_warning(tmp_path):
    Local = collections.namedtuple("Local", "a")
    path = tmp_path / "nt.mdl"
    storage.save({"p": Local(1)}, path)
    with pytest.warns(UserWarning, match="plain tuple"):
        out = storage.load(path)
    assert out["p"] == (1,) and type(out["p"]) is tuple


def test_colliding_keys_are_refused(tmp_path):
    with pytest.raises(ValueError, match="same checkpoint key 'a.b'"):
        storage.save({"a.b": 1, "a": {"b": 2}}, tmp_path / "c.mdl")
    assert not os.listdir(tmp_path)


def test_tuple_keys_are_refused(tmp_path):
    with pytest.raises(ValueError, match="Dict key"):
        storage.save({(1, 2): 1}, tmp_path / "c.mdl")


@pytest.mark.parametrize("dtype", [torch.int8, torch.complex64, torch.float8_e4m3fn])
def test_unstorable_dtypes_raise_value_error(dtype, tmp_path):
    with pytest.raises(ValueError, match="no RtFx type"):
        storage.save({"t": torch.zeros(2, dtype=dtype)}, tmp_path / "c.mdl")
    assert not os.listdir(tmp_path)  # the temporary file was removed


def test_bare_tensor_is_refused(tmp_path):
    with pytest.raises(ValueError, match="container"):
        storage.save(torch.ones(2), tmp_path / "c.mdl")


def test_large_pickle_uses_dense_attributes(tmp_path):
    big = {"blob": bytes(range(256)) * 1000}  # 256 KB: over HDF5's compact attribute limit
    out = roundtrip(big, tmp_path)
    assert out["blob"] == big["blob"]


def test_jax_arrays_and_lazy_tensors_written_without_torch(tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    from jax_backend.lazy import LazyTensor

    lazy = LazyTensor(jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3))
    raw_bf16 = jnp.asarray([1.0, -2.0, 0.5], dtype=jnp.bfloat16)
    out = roundtrip({"lazy": lazy, "jax": raw_bf16, "i": jnp.arange(3)}, tmp_path)
    assert lazy._value is None  # saving did not materialize a torch tensor
    assert torch.equal(out["lazy"], torch.arange(6.0).reshape(2, 3))
    assert out["jax"].dtype == torch.bfloat16
    assert torch.equal(out["jax"], torch.tensor([1.0, -2.0, 0.5], dtype=torch.bfloat16))
    assert torch.equal(out["i"], torch.arange(3))


# ---------------------------------------------------------------------------------------------
# Layout (what the reference reader relies on)


def test_layout_matches_spec(tmp_path):
    path = tmp_path / "layout.mdl"
    t = torch.randn(300, 500)
    storage.save(
        {
            "w": t,
            "tied": t,
            "bf": torch.randn(4).bfloat16(),
            "s": torch.tensor(1.0),
            "n": None,
            "x": 3,
            "obj": torch.float16,
        },
        path,
    )
    with h5py.File(path, "r") as f:
        assert f.attrs["__version__"] == 0.5 and f.attrs["__version__"].dtype == np.float64
        assert f.attrs["__cstorch_version__"] == "2.10.0"
        assert bool(f.attrs["__SUCCESS__"])
        human, spec = json.loads(f.attrs["__spec__"])
        assert human == {"w": "*", "tied": "*", "bf": "*", "s": "*", "n": "*", "x": "*", "obj": "*"}
        assert json.loads(spec)[0] == 1 and json.loads(spec)[1]["type"] == "builtins.dict"
        assert sorted(f) == ["bf", "obj", "s", "w"]  # no datasets for None, ints, links
        w = f["w"]
        assert w.chunks and w.compression_opts is None and "32004" in w._filters
        assert (
            w.attrs["__NUMPY__"]
            and w.attrs["__TORCH__"]
            and w.attrs["__TYPE__"] == "TorchTensorSerializer"
        )
        assert list(w.attrs["dtypes"]) == ["torch.float32"] and w.attrs["shapes"].tolist() == [
            [300, 500]
        ]
        assert w.attrs["rtfx_dtypes"].tolist() == [11]
        assert f["bf"].dtype == np.int16 and f["bf"].attrs["rtfx_dtypes"].tolist() == [15]
        assert list(f["bf"].attrs["dtypes"]) == ["torch.bfloat16"]
        assert f["s"].shape == () and f["s"].chunks is None  # 0-d: uncompressed
        assert f["obj"].shape is None and isinstance(f["obj"].attrs["__BYTES__"], np.void)
        tied = json.loads(f.attrs["tied.__metadata__"])
        assert tied["tied.__metadata__"] == {
            "key": "w",
            "__LINKED__": True,
            "__TYPE__": "LinkedObject",
            "__NONE__": True,
        }
        x = json.loads(f.attrs["x.__metadata__"])
        assert x["__objects__"] == ["x"] and x["x.__metadata__"]["scalar_value"] == 3


# ---------------------------------------------------------------------------------------------
# Laziness and map_location


def test_load_reads_only_accessed_tensors(tmp_path, monkeypatch):
    path = tmp_path / "lazy.mdl"
    state = {f"t{i}": torch.full((64, 64), float(i)) for i in range(20)}
    storage.save(state, path)
    reads = []
    original = H5Reader.read_array
    monkeypatch.setattr(
        H5Reader, "read_array", lambda self, key: reads.append(key) or original(self, key)
    )
    dataset_reads = []
    original_getitem = h5py.Dataset.__getitem__
    monkeypatch.setattr(
        h5py.Dataset,
        "__getitem__",
        lambda self, idx: dataset_reads.append(self.name) or original_getitem(self, idx),
    )
    out = storage.load(path)
    assert reads == [] and dataset_reads == []
    assert out["t7"].sum().item() == 7 * 64 * 64
    assert reads == ["t7"]
    assert out["t3"][0, 0].item() == 3.0
    assert reads == ["t7", "t3"]


def test_map_location(tmp_path):
    path = tmp_path / "m.mdl"
    storage.save({"a": torch.ones(2)}, path)
    plain = storage.load(path)["a"]
    assert isinstance(plain, DeferredTorchTensor)
    plain.sum()
    assert not plain.is_materialized  # not cached by default
    assert isinstance(storage.load(path, map_location="cpu")["a"], DeferredTorchTensor)
    assert isinstance(
        storage.load(path, map_location=torch.device("cpu"))["a"], DeferredTorchTensor
    )
    cached = storage.load(path, map_location="cache")["a"]
    cached.sum()
    assert cached.is_materialized
    meta = storage.load(path, map_location="meta")["a"]
    assert meta.device.type == "meta" and not isinstance(meta, DeferredTorchTensor)
    with pytest.raises(TypeError, match="map_location"):
        storage.load(path, map_location=lambda s, loc: s)


def test_deferred_tensor_semantics(tmp_path):
    path = tmp_path / "d.mdl"
    storage.save({"a": torch.arange(4.0)}, path)
    a = storage.load(path)["a"]
    a.add_(1)  # in place: the modified value is kept
    assert torch.equal(a, torch.arange(4.0) + 1) and a.is_modified
    b = storage.load(path)["a"]
    view = b.view(2, 2)
    view[0, 0] = 100.0  # writes through a view stick
    assert b[0].item() == 100.0
    c = storage.load(path)["a"]
    assert torch.equal(pickle.loads(pickle.dumps(c)), torch.arange(4.0))  # pickles as plain tensor
    buffer = io.BytesIO()
    torch.save({"c": c}, buffer)
    buffer.seek(0)
    assert type(torch.load(buffer)["c"]) is torch.Tensor
    module = torch.nn.Linear(4, 1)
    storage.save({"weight": torch.ones(1, 4), "bias": torch.zeros(1)}, tmp_path / "lin.mdl")
    module.load_state_dict(storage.load(tmp_path / "lin.mdl"))
    assert torch.equal(module.weight.detach(), torch.ones(1, 4))


def test_modified_file_is_detected(tmp_path):
    path = tmp_path / "t.mdl"
    storage.save({"a": torch.ones(3)}, path)
    a = storage.load(path)["a"]
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    with pytest.raises(RuntimeError, match="modified"):
        a.sum()
    with serializers.check_deferred_backing_storage(False):
        assert a.sum().item() == 3.0


def test_deferred_tensor_survives_path_replacement(tmp_path):
    path = tmp_path / "r.mdl"
    storage.save({"a": torch.ones(3)}, path)
    a = storage.load(path)["a"]
    os.unlink(path)
    storage.save({"a": torch.zeros(3)}, path)
    assert torch.equal(a, torch.ones(3))  # reads the file that was loaded


def test_resave_loaded_checkpoint(tmp_path):
    t = torch.randn(4, 4)
    first = roundtrip({"a": t, "b": t, "c": 1}, tmp_path, "one.mdl")
    second = roundtrip(first, tmp_path, "two.mdl")
    assert torch.equal(second["a"], t) and second["a"] is second["b"] and second["c"] == 1


# ---------------------------------------------------------------------------------------------
# Safety and errors


def test_save_overwrites_like_torch_save(tmp_path):
    # A script that saves to a fixed path runs twice in a row (deliberate difference: 2.10
    # refuses). The replaced file is whole, and no temporary file is left behind.
    path = tmp_path / "x.mdl"
    storage.save({"a": torch.ones(3)}, path)
    storage.save({"a": torch.full((3,), 7.0), "b": torch.zeros(2)}, path)
    loaded = storage.load(path)
    assert torch.equal(loaded["a"] + 0, torch.full((3,), 7.0)) and set(loaded) == {"a", "b"}
    assert sorted(os.listdir(tmp_path)) == ["x.mdl"]


def test_exist_ok_false_keeps_the_reference_refusal(tmp_path):
    path = tmp_path / "x.mdl"
    storage.save({"a": torch.ones(1)}, path)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match=f"Checkpoint at '{path}' already exists"):
        storage.save({"a": torch.zeros(1)}, path, exist_ok=False)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["x.mdl"]


def test_exist_ok_false_losing_a_race_says_what_was_kept(tmp_path, monkeypatch):
    # Another writer publishes the path between our check and our publish: the other file
    # stays, ours is not kept (no temporary file left), and the error says so truthfully.
    from cstorch.storage.h5_format import H5Writer

    path = tmp_path / "x.mdl"
    commit = H5Writer.commit

    def racing_commit(self):
        path.write_bytes(b"the other writer's checkpoint")
        commit(self)

    monkeypatch.setattr(H5Writer, "commit", racing_commit)
    with pytest.raises(FileExistsError, match="appeared while saving.*was not kept.*exist_ok"):
        storage.save({"a": torch.zeros(1)}, path, exist_ok=False)
    assert path.read_bytes() == b"the other writer's checkpoint"
    assert sorted(os.listdir(tmp_path)) == ["x.mdl"]


def test_overwrite_replaces_a_symlink_not_its_target(tmp_path):
    target = tmp_path / "step_10.mdl"
    storage.save({"a": torch.ones(1)}, target)
    link = tmp_path / "latest.mdl"
    link.symlink_to(target)
    storage.save({"a": torch.zeros(1)}, link)
    assert not link.is_symlink()
    assert torch.equal(storage.load(target)["a"] + 0, torch.ones(1))
    assert torch.equal(storage.load(link)["a"] + 0, torch.zeros(1))


def test_save_to_a_directory_names_the_problem(tmp_path):
    with pytest.raises(IsADirectoryError, match="it is a directory"):
        storage.save({"a": torch.ones(1)}, tmp_path)


def test_overwrite_keeps_a_loaded_checkpoints_values(tmp_path):
    path = tmp_path / "r.mdl"
    storage.save({"a": torch.ones(3)}, path)
    a = storage.load(path)["a"]
    storage.save({"a": torch.zeros(3)}, path)
    assert torch.equal(a, torch.ones(3))  # still reads the file that was loaded
    assert torch.equal(storage.load(path)["a"] + 0, torch.zeros(3))


def test_partially_written_checkpoint(tmp_path):
    path = tmp_path / "p.mdl"
    storage.save({"a": torch.ones(1)}, path)
    with h5py.File(path, "a") as f:
        del f.attrs["__SUCCESS__"]
    with pytest.raises(RuntimeError, match=f"Cannot load partially written checkpoint at '{path}'"):
        storage.load(path)


def test_truncated_and_garbage_files_name_the_path(tmp_path):
    good = tmp_path / "good.mdl"
    storage.save({"a": torch.randn(100, 100)}, good)
    truncated = tmp_path / "truncated.mdl"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    garbage = tmp_path / "garbage.mdl"
    garbage.write_bytes(os.urandom(4096))
    empty = tmp_path / "empty.mdl"
    empty.write_bytes(b"")
    for path in (truncated, garbage, empty):
        with pytest.raises(RuntimeError, match=str(path)):
            storage.load(path)
    with pytest.raises(FileNotFoundError, match="missing.mdl"):
        storage.load(tmp_path / "missing.mdl")


def test_torch_checkpoint_fallback(tmp_path):
    path = tmp_path / "model.pt"
    state = {"w": torch.randn(3), "step": 4, "nested": {"b": torch.ones(1)}}
    torch.save(state, path)
    out = storage.load(path)
    assert torch.equal(out["w"], state["w"]) and out["step"] == 4
    assert storage.load(path, map_location="cache")["step"] == 4
    with open(path, "rb") as f:  # file objects go straight to torch.load
        assert torch.equal(storage.load(f)["w"], state["w"])


def test_torch_checkpoint_with_objects_needs_opt_in(tmp_path):
    path = tmp_path / "objs.pt"
    torch.save({"obj": Custom(1)}, path)
    with pytest.raises(RuntimeError, match="unsafe_allow_pickle=True") as info:
        storage.load(path)
    assert str(path) in str(info.value)
    assert storage.load(path, unsafe_allow_pickle=True)["obj"] == Custom(1)


def test_safetensors_file_loads(tmp_path):
    from cstorch.storage import safetensors_format

    path = tmp_path / "w.safetensors"
    tensors = {"a": torch.randn(2, 3), "b": torch.randn(4).bfloat16(), "c": torch.tensor([True])}
    safetensors_format.write(path, tensors, {"step": "3"})
    out = storage.load(path)
    for key, value in tensors.items():
        assert out[key].dtype == value.dtype and torch.equal(out[key], value)
    assert safetensors_format.read_metadata(path) == {"step": "3"}


def test_failed_save_leaves_nothing(tmp_path):
    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("nope")

    with pytest.raises(TypeError, match="pickling it failed"):
        storage.save({"a": torch.ones(2), "b": Unpicklable()}, tmp_path / "f.mdl")
    assert os.listdir(tmp_path) == []


def test_no_warnings_on_plain_roundtrip(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        roundtrip({"a": torch.ones(2), "b": [1, None]}, tmp_path)
