"""The graph cache's entries (``jax_backend.graph_cache``) and its key (``fingerprint``).

A stored step comes back as the same program: same jaxpr, same numbers. An entry that is
truncated, garbage, of another version, or tampered with (an op that is not a lowered
ATen overload, a reference to a later node, an absurd shape) is a miss with one warning and
runs nothing. The key changes with what the step reads, and only with that.
"""

from __future__ import annotations

import gc
import io
import logging
import os
import stat
import subprocess
import sys
import threading
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from jax_backend import Program, Slot, capture_step, dtypes, graph_cache, torch_ops
from jax_backend.graph_cache import codec, explain, fingerprint, sources, storage
from jax_backend.graph_cache.fingerprint import Fingerprinter, NotCacheable
from tests.graph_cache_entries import first_node as _first, rewrite_entry, rewrite_payload
from tests.paths import REPO
from tests.training import descending

KEY = "ab" * 32


def _captured():
    """A small training step: a linear layer, a loss, SGD written in torch ops, a constant
    tensor baked into the graph, and a dict of outputs with a non-tensor leaf."""
    torch.manual_seed(0)
    state = {"w": torch.randn(3, 4, requires_grad=True), "b": torch.zeros(3, requires_grad=True)}
    offset = torch.tensor([0.5, -1.0, 2.0])  # not state: a graph constant

    def step(x, y):
        out = torch.nn.functional.linear(x, state["w"], state["b"]) + offset
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        with torch.no_grad():
            for p in state.values():
                p.sub_(0.1 * p.grad)
                p.grad = None
        return {"loss": loss, "tag": "train", "scale": 0.5, "none": None}

    slots = [Slot(state, "w", "w"), Slot(state, "b", "b")]
    x, y = torch.randn(5, 4), torch.tensor([0, 2, 1, 1, 0])
    return capture_step(step, slots, [x, y]), state, (x, y)


def _run(captured, state, inputs):
    program = Program(captured)
    arrays = [dtypes.tensor_to_array(state[k]) for k in ("w", "b")]
    used = [arrays[i] for i in captured.used_state]
    new_state, outputs = program(used, [dtypes.tensor_to_array(t) for t in inputs])
    return program, [np.asarray(a) for a in list(new_state) + list(outputs)]


def _load(directory, state, inputs, extra_files=()):
    return graph_cache.load(
        str(directory), KEY, [state["w"], state["b"]], list(inputs), extra_files=extra_files
    )


@pytest.fixture()
def stored(tmp_path):
    captured, state, inputs = _captured()
    assert graph_cache.store(str(tmp_path), KEY, captured, {"closures": []})
    return tmp_path, captured, state, inputs


@pytest.mark.slow
def test_a_stored_step_loads_as_the_same_program(stored):
    directory, captured, state, inputs = stored
    # no temporary file left behind
    assert sorted(os.listdir(directory)) == [graph_cache.SECRET, f"{KEY}.npz"]
    entry = _load(directory, state, inputs)
    assert entry is not None and entry.extras == {"closures": []}
    loaded = entry.captured
    for field in (
        "used_state",
        "written_state",
        "num_inputs",
        "output_spec",
        "output_is_tensor",
        "output_constants",
    ):
        assert getattr(loaded, field) == getattr(captured, field), field
    assert "train" in loaded.output_constants and 0.5 in loaded.output_constants

    def ops(graph):  # placeholders are renamed; get_attr names too
        return [
            (n.op, n.target if n.op == "call_function" else None, len(n.args))
            for n in graph.graph.nodes
        ]

    assert ops(loaded.graph) == ops(captured.graph)

    program_a, values_a = _run(captured, state, inputs)
    program_b, values_b = _run(loaded, state, inputs)
    for a, b in zip(values_a, values_b):
        np.testing.assert_array_equal(a, b)
    arrays = [dtypes.tensor_to_array(state[k]) for k in ("w", "b")]
    jax_inputs = [dtypes.tensor_to_array(t) for t in inputs]
    assert str(program_a.jaxpr(arrays, jax_inputs)) == str(program_b.jaxpr(arrays, jax_inputs))


def test_missing_entry_is_a_silent_miss(tmp_path, recwarn):
    _, state, inputs = _captured()
    assert _load(tmp_path, state, inputs) is None
    assert not [w for w in recwarn if issubclass(w.category, graph_cache.GraphCacheWarning)]


PAYLOAD = "__import__('os').system('touch PWNED')"


def _truncate(path):
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])


def _garbage(path):
    Path(path).write_bytes(os.urandom(4096))


def _rewrite(path, edit):  # signed again: these test the decoder behind the HMAC
    rewrite_entry(path, edit, sign=True)


def _rezip(path, change_members, compression=zipfile.ZIP_STORED):
    def rezip(payload):
        with zipfile.ZipFile(io.BytesIO(payload)) as src:
            members = [(m.filename, src.read(m)) for m in src.infolist()]
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=compression) as dst:
            for name, data in change_members(members):
                dst.writestr(name, data)
        return buffer.getvalue()

    rewrite_payload(path, rezip, sign=True)


def _compressed(path):
    _rezip(path, lambda members: members, zipfile.ZIP_DEFLATED)


def _set_target(target):
    def edit(doc):
        _first(doc, "aten::")[1] = target

    return edit


def _set_version(doc):
    doc["versions"]["format"] = graph_cache.FORMAT + 1


def _later_reference(doc):
    node = _first(doc, "aten::")
    node[2][0] = {"node": len(doc["nodes"]) - 1}


def _absurd_shape(doc):
    _first(doc, "aten::")[4] = {"tensor": ["float32", [1 << 50], [1]]}


def _string_argument(doc):
    node = _first(doc, "aten::")
    node[2].append({"eval": PAYLOAD})


def _other_key(doc):
    doc["key"] = "cd" * 32


def _bad_state_index(doc):
    doc["used_state"] = [0, 7]


def _huge_array_header(path):
    def change(members):
        name, _ = members[-1]
        header = np.lib.format.header_data_from_array_1_0(np.zeros(0, np.uint8))
        header["shape"] = (1 << 40,)
        buffer = io.BytesIO()
        np.lib.format.write_array_header_1_0(buffer, header)
        return members[:-1] + [(name, buffer.getvalue())]

    _rezip(path, change)


CORRUPTIONS = {
    "truncated": lambda p: _truncate(p),
    "garbage": lambda p: _garbage(p),
    "compressed members": lambda p: _compressed(p),
    "another format version": lambda p: _rewrite(p, _set_version),
    "target builtins.eval": lambda p: _rewrite(p, _set_target("builtins::eval.default")),
    "target with code": lambda p: _rewrite(p, _set_target(PAYLOAD)),
    "an op without a lowering": lambda p: _rewrite(
        p, _set_target("aten::_local_scalar_dense.default")
    ),
    "a reference to a later node": lambda p: _rewrite(p, _later_reference),
    "an absurd shape": lambda p: _rewrite(p, _absurd_shape),
    "an unknown argument tag": lambda p: _rewrite(p, _string_argument),
    "another key": lambda p: _rewrite(p, _other_key),
    "a state index out of range": lambda p: _rewrite(p, _bad_state_index),
    "an array header promising a terabyte": lambda p: _huge_array_header(p),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_a_damaged_entry_is_a_miss_with_one_warning(stored, corrupt, monkeypatch):
    directory, _, state, inputs = stored
    monkeypatch.chdir(directory)
    corrupt(str(directory / f"{KEY}.npz"))
    with pytest.warns(graph_cache.GraphCacheWarning) as warned:
        assert _load(directory, state, inputs) is None
    assert len(warned) == 1 and "\n" not in str(warned[0].message)
    assert not os.path.exists(directory / "PWNED")


# An optimizer step carries its spec in the graph: written here as another process would
# write it (JSON text, registered nowhere), it runs, and it is stored and loaded as it is.
SGD_SPEC = '{"dynamic": ["learning_rate"], "rule": "sgd", "static": {"momentum": 0.9}}'


def _sgd_captured():
    state = {"w": torch.tensor([1.0, -2.0, 3.0]), "buf": torch.zeros(3)}

    def step(grad, lr):
        new_w, new_buf = torch.ops.cstorch.optimizer_step(
            SGD_SPEC, [state["w"]], [grad], [state["buf"]], [lr]
        )
        state["w"].copy_(new_w)
        state["buf"].copy_(new_buf)
        return new_w

    slots = [Slot(state, "w", "w"), Slot(state, "buf", "buf")]
    inputs = (torch.tensor([0.5, 0.25, -1.0]), torch.tensor(0.1))
    return capture_step(step, slots, list(inputs)), state, inputs


def test_an_optimizer_step_carries_its_spec_through_the_cache(tmp_path):
    captured, state, inputs = _sgd_captured()
    assert graph_cache.store(str(tmp_path), KEY, captured, {})
    entry = graph_cache.load(str(tmp_path), KEY, [state["w"], state["buf"]], list(inputs))
    assert entry is not None
    (node,) = [
        n
        for n in entry.captured.graph.graph.nodes
        if n.target is torch.ops.cstorch.optimizer_step.default
    ]
    assert node.args[0] == SGD_SPEC
    program = Program(entry.captured)
    arrays = [dtypes.tensor_to_array(state[k]) for k in ("w", "buf")]
    new_state, _ = program(
        [arrays[i] for i in entry.captured.used_state], [dtypes.tensor_to_array(t) for t in inputs]
    )
    grad, lr = inputs[0].numpy(), 0.1
    written = {
        ("w", "buf")[i]: np.asarray(a) for i, a in zip(entry.captured.written_state, new_state)
    }
    buf = 0.9 * 0.0 + grad  # torch's SGD with momentum, first step: buf = grad
    np.testing.assert_allclose(written["buf"], buf, rtol=1e-6)
    np.testing.assert_allclose(written["w"], np.array([1.0, -2.0, 3.0]) - lr * buf, rtol=1e-6)


@pytest.mark.parametrize(
    "spec",
    [
        "not json",
        '{"rule": "sgd"}',
        '["sgd", {}, []]',
        '{"dynamic": [], "rule": "os.system", "static": {}}',
        '{"dynamic": [1], "rule": "sgd", "static": {}}',
        '{"dynamic": [], "rule": "sgd", "static": [], "more": 1}',
    ],
)
def test_an_optimizer_step_with_a_malformed_spec_is_a_miss(tmp_path, spec):
    captured, state, inputs = _sgd_captured()
    assert graph_cache.store(str(tmp_path), KEY, captured, {})
    rewrite_entry(
        tmp_path / f"{KEY}.npz",
        lambda doc: _first(doc, "cstorch::optimizer_step")[2].__setitem__(0, spec),
        sign=True,
    )
    with pytest.warns(graph_cache.GraphCacheWarning, match="optimizer step without a valid"):
        assert (
            graph_cache.load(str(tmp_path), KEY, [state["w"], state["buf"]], list(inputs)) is None
        )
    with pytest.raises(ValueError, match="not an optimizer spec"):
        torch_ops.optimizer_spec(spec)


def test_an_oversized_entry_is_refused_unread(stored, monkeypatch):
    directory, _, state, inputs = stored
    monkeypatch.setattr(codec, "MAX_FILE_BYTES", 100)
    with pytest.warns(graph_cache.GraphCacheWarning, match="more than the limit"):
        assert _load(directory, state, inputs) is None


def test_a_changed_or_new_source_file_is_a_miss(stored, tmp_path, monkeypatch):
    directory, captured, state, inputs = stored
    source = tmp_path / "user_code.py"
    source.write_text("A = 1\n")
    graph_cache.store(str(directory), KEY, captured, {}, extra_files=[str(source)])
    assert _load(directory, state, inputs, extra_files=[str(source)]) is not None
    source.write_text("A = 2\n")
    assert _load(directory, state, inputs, extra_files=[str(source)]) is None
    other = tmp_path / "other.py"
    other.write_text("")
    monkeypatch.setattr(
        sources, "loaded_source_files", lambda: {str(other)}
    )  # a module the entry never saw is loaded now
    assert _load(directory, state, inputs) is None


def test_an_entry_for_other_state_or_inputs_is_a_miss(stored):
    directory, _, state, inputs = stored
    wider = {"w": torch.zeros(3, 5), "b": state["b"]}
    with pytest.warns(graph_cache.GraphCacheWarning, match="placeholder"):
        assert _load(directory, wider, inputs) is None
    with pytest.warns(graph_cache.GraphCacheWarning, match="placeholder"):
        assert _load(directory, state, [inputs[0].double(), inputs[1]]) is None


def test_an_unwritable_directory_stores_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.warns(graph_cache.GraphCacheWarning, match="graph cache is off"):
        assert not graph_cache.store(str(blocker / "sub"), KEY, _captured()[0], {})


def test_a_non_json_output_constant_is_not_stored(tmp_path):
    captured = capture_step(lambda x: (x * 2, torch.float32), [], [torch.ones(2)])
    assert not graph_cache.store(str(tmp_path), KEY, captured, {})
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".npz")]


def test_the_cache_is_off_unless_the_environment_asks_for_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(graph_cache.ENV_VAR, raising=False)
    assert graph_cache.default_directory() is None  # the default
    for off in ("off", "0", "false", ""):
        monkeypatch.setenv(graph_cache.ENV_VAR, off)
        assert graph_cache.default_directory() is None
    monkeypatch.setenv(graph_cache.ENV_VAR, str(tmp_path / "g"))
    assert graph_cache.default_directory() == str(tmp_path / "g")
    monkeypatch.setenv(graph_cache.ENV_VAR, "on")
    assert graph_cache.default_directory() == str(tmp_path / "cstorch-jax" / "graphs")


# ------------------------------------------------------------------------------ the key
def _digest(*values, state=()):
    fp = Fingerprinter(state)
    for i, value in enumerate(values):
        fp.add(str(i), value)
    return fp.hexdigest()


SCALE = 2.0


def _reads_scale(x):
    return x * SCALE


def test_the_fingerprint_follows_code_closures_globals_and_constant_values(monkeypatch):
    def make(k):
        return lambda x: x * k

    assert _digest(make(2)) == _digest(make(2))
    assert _digest(make(2)) != _digest(make(3))  # a closure value
    assert _digest(lambda x: x + 1) != _digest(lambda x: x + 2)  # code
    before = _digest(_reads_scale)
    monkeypatch.setitem(globals(), "SCALE", 3.0)
    assert _digest(_reads_scale) != before  # a global the code names

    config = __import__("types").ModuleType("config")  # `import config; config.lr = ...`
    config.lr = 0.1
    namespace = {"config": config}
    exec("def reads_config(x):\n    return x * config.lr\n", namespace)
    first = _digest(namespace["reads_config"])
    config.lr = 0.2
    assert _digest(namespace["reads_config"]) != first

    weight = torch.ones(3)
    state_digest = _digest(weight, state=[weight])
    module = torch.nn.Linear(3, 2)
    assert _digest(module) != _digest(torch.nn.Linear(3, 4))  # shapes of non-state tensors
    weight.add_(1)
    assert _digest(weight, state=[weight]) == state_digest  # state values are graph inputs
    constant = torch.ones(3)
    first = _digest(constant)
    constant[0] = 5  # a constant's value is baked into the graph
    assert _digest(constant) != first
    assert _digest({"b", "a", "c"}) == _digest({"c", "a", "b"})
    assert _digest(torch.Tensor.add) != _digest(torch.Tensor.sub)  # C methods, by name
    assert _digest(torch.ops.aten.add.Tensor) != _digest(torch.ops.aten.add.Scalar)
    assert _digest(torch.nn.Linear(3, 2).train()) != _digest(torch.nn.Linear(3, 2).eval())


def test_the_fingerprint_refuses_what_it_cannot_describe():
    with open(os.devnull) as file:
        for value in (threading.Lock(), file, torch.Generator(), _started_generator()):
            with pytest.raises(NotCacheable):
                _digest({"held": value})


def _started_generator():
    generator = (x for x in range(3))
    next(generator)
    return generator


def test_an_unstarted_generator_is_described_by_what_it_will_yield():
    items = [1, 2]
    generator = (x for x in items)
    before = Fingerprinter()
    before.add("g", generator)
    list(generator)
    after = Fingerprinter(consumable=before.generators)
    after.add("g", generator)
    assert after.hexdigest() == before.hexdigest() and after.consumed == [generator]
    assert _digest((x for x in [1, 3])) != _digest((x for x in [1, 2]))


def test_library_code_is_named_and_user_code_is_hashed():
    assert fingerprint.is_library_file(torch.__file__)
    assert not fingerprint.is_library_file(__file__)
    steps = []
    for body in ("x + 1", "x + 2"):  # as `python -c` or a notebook cell defines them
        namespace = {}
        exec(compile(f"def step(x):\n    return {body}\n", "<string>", "exec"), namespace)
        steps.append(namespace["step"])
    assert _digest(steps[0]) != _digest(steps[1])


def test_torch_global_hooks_and_modes_enter_the_key():
    def key():
        return graph_cache.step_key(Fingerprinter(), [], [torch.ones(2)], None, {}, "")

    before = key()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: o * 2)
    try:
        assert key() != before
    finally:
        handle.remove()
    assert key() == before

    class Passthrough(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough(), pytest.raises(NotCacheable, match="mode"):
        key()


# ---------------------------------------------------------------------------- integrity
def _doubling():
    """A step whose loss is scaled by the constant 2.0 (an argument of one graph node)."""
    torch.manual_seed(0)
    state = {"w": torch.randn(3, 4, requires_grad=True), "b": torch.zeros(3, requires_grad=True)}

    step = descending(
        lambda x, y: torch.nn.functional.linear(x, state["w"], state["b"]).square().mean() * 2.0,
        state.values,
    )
    slots = [Slot(state, "w", "w"), Slot(state, "b", "b")]
    x, y = torch.randn(5, 4), torch.tensor([0, 2, 1, 1, 0])
    return capture_step(step, slots, [x, y]), state, (x, y)


def _times_200(doc):
    """The forward's ``loss * 2.0`` (the first node with the float 2.0) made ``* 200.0``."""

    def is_two(a):
        return type(a) is float and a == 2.0

    node = next(n for n in doc["nodes"] if isinstance(n[1], str) and any(map(is_two, n[2])))
    node[2] = [200.0 if is_two(a) else a for a in node[2]]


def test_an_entry_edited_in_place_is_a_miss_that_runs_nothing(tmp_path):
    """A constant 2.0 made 200.0 and the entry re-zipped, its ``key`` field intact: the
    HMAC no longer matches. (Signed again with the secret, the same edit would load and
    compute 100x the loss: the HMAC is what refuses it.)"""
    captured, state, inputs = _doubling()
    assert graph_cache.store(str(tmp_path), KEY, captured, {})
    entry = tmp_path / f"{KEY}.npz"
    original = entry.read_bytes()
    loss = _run(captured, state, inputs)[1][-1]

    rewrite_entry(entry, _times_200)
    with pytest.warns(graph_cache.GraphCacheWarning, match="HMAC") as warned:
        assert _load(tmp_path, state, inputs) is None
    assert len(warned) == 1

    entry.write_bytes(original)
    rewrite_entry(entry, _times_200, sign=True)
    forged = _load(tmp_path, state, inputs)
    np.testing.assert_allclose(_run(forged.captured, state, inputs)[1][-1], 100 * loss, rtol=1e-5)


def _captured_entry(directory):
    captured, state, inputs = _captured()
    assert graph_cache.store(str(directory), KEY, captured, {"closures": []})
    return directory / f"{KEY}.npz", state, inputs


def test_an_entry_of_another_user_is_refused(tmp_path, monkeypatch):
    entry, state, inputs = _captured_entry(tmp_path)
    if os.geteuid() == 0:
        os.chown(entry, 65534, 65534)  # nobody
    else:  # the directory was accepted already: only the entry's owner now differs
        monkeypatch.setattr(storage, "_user", lambda: os.geteuid() + 1)
    with pytest.warns(graph_cache.GraphCacheWarning, match="owned by user id") as warned:
        assert _load(tmp_path, state, inputs) is None
    assert len(warned) == 1


def test_a_symlinked_entry_is_refused(tmp_path):
    entry, state, inputs = _captured_entry(tmp_path)
    elsewhere = tmp_path / "elsewhere.bin"
    entry.rename(elsewhere)  # a valid entry, signed with this directory's secret
    entry.symlink_to(elsewhere)
    with pytest.warns(graph_cache.GraphCacheWarning, match="symbolic link") as warned:
        assert _load(tmp_path, state, inputs) is None
    assert len(warned) == 1


FIFO_PROBE = """
import os, sys, warnings
from pathlib import Path
from jax_backend import graph_cache
directory = sys.argv[1]
os.mkfifo(os.path.join(directory, "KEY.npz"))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert graph_cache.load(directory, "KEY", [], []) is None
assert len(caught) == 1 and "FIFO" in str(caught[0].message), [str(w.message) for w in caught]
print("refused")
"""


@pytest.mark.slow
def test_a_fifo_in_place_of_an_entry_is_refused_without_blocking(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    root = REPO
    out = subprocess.run(
        [sys.executable, "-c", FIFO_PROBE.replace("KEY", KEY), str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=root),
    )
    assert out.returncode == 0 and "refused" in out.stdout, out.stderr[-2000:]


def test_a_shared_directory_gets_a_private_subdirectory(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    entry, state, inputs = _captured_entry(shared)
    private = shared / f"cstorch-graphs-uid{os.geteuid()}"
    assert not entry.exists() and (private / entry.name).exists()
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert stat.S_IMODE((private / graph_cache.SECRET).stat().st_mode) == 0o600
    assert _load(shared, state, inputs) is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_shared_directory_whose_private_subdirectory_is_taken_turns_the_cache_off(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    taken = shared / f"cstorch-graphs-uid{os.geteuid()}"
    taken.mkdir(mode=0o700)
    os.chown(taken, 65534, 65534)  # planted by another user
    captured, state, inputs = _captured()
    with pytest.warns(graph_cache.GraphCacheWarning, match="graph cache is off") as warned:
        assert not graph_cache.store(str(shared), KEY, captured, {})
        assert _load(shared, state, inputs) is None
    assert len(warned) == 1 and os.listdir(taken) == []


def test_a_secret_others_can_read_turns_the_cache_off(tmp_path):
    (tmp_path / graph_cache.SECRET).write_bytes(os.urandom(graph_cache.SECRET_BYTES))
    (tmp_path / graph_cache.SECRET).chmod(0o644)
    with pytest.warns(graph_cache.GraphCacheWarning, match="secret"):
        assert not graph_cache.store(str(tmp_path), KEY, _captured()[0], {})


def test_an_entry_from_another_cache_directory_is_refused(tmp_path):
    """Copied from a directory with another secret (another user's, another machine's)."""
    entry, state, inputs = _captured_entry(tmp_path / "theirs")
    mine = tmp_path / "mine"
    graph_cache.store(str(mine), "cd" * 32, _captured()[0], {})  # makes its secret
    (mine / entry.name).write_bytes(entry.read_bytes())
    with pytest.warns(graph_cache.GraphCacheWarning, match="HMAC"):
        assert _load(mine, state, inputs) is None


# -------------------------------------------------------------- what else enters the key
def _step_key(fp=None):
    return graph_cache.step_key(fp or Fingerprinter(), [], [torch.ones(2)], None, {}, "")


def test_the_command_line_the_environment_and_the_directory_enter_the_key(tmp_path, monkeypatch):
    before = _step_key()
    monkeypatch.setenv("CSTORCH_TEST_SOME_SETTING", "1")
    with_env = _step_key()
    assert with_env != before
    monkeypatch.setenv("CSTORCH_TEST_SOME_SETTING", "2")
    assert _step_key() not in (before, with_env)
    monkeypatch.delenv("CSTORCH_TEST_SOME_SETTING")
    assert _step_key() == before
    monkeypatch.setenv("OLDPWD", "/somewhere/else")  # listed as irrelevant
    assert _step_key() == before
    monkeypatch.setattr(sys, "argv", sys.argv + ["--lr", "0.5"])
    assert _step_key() != before
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert _step_key() != before


def test_a_replaced_library_function_changes_the_key(monkeypatch):
    """Named by the step (``F.gelu``, ``torch.nn.functional.gelu``) or only called inside
    the library (``nn.GELU`` calls ``F.gelu``): the object found at that name counts."""
    import torch.nn.functional as F

    def by_alias(x):
        return F.gelu(x)

    def by_path(x):
        return torch.nn.functional.gelu(x)

    module = torch.nn.GELU()
    before = [_digest(by_alias), _digest(by_path), _step_key()]
    assert "torch.nn.functional.gelu" not in fingerprint.replaced_library_attributes()
    # Libraries make functions with exec too (no source file): those are not user code.
    scipy_optimize = pytest.importorskip("scipy.optimize")
    assert not [
        name for name in fingerprint.replaced_library_attributes() if name.startswith("scipy.")
    ], scipy_optimize

    monkeypatch.setattr(F, "gelu", lambda x, approximate="none": x * 0.5)  # user code
    assert "torch.nn.functional.gelu" in fingerprint.replaced_library_attributes()
    patched = [_digest(by_alias), _digest(by_path), _step_key()]
    assert all(a != b for a, b in zip(before, patched))
    assert _digest(module) == _digest(torch.nn.GELU())  # ... which is why the key scans

    monkeypatch.setattr(F, "gelu", F.silu)  # another library function: seen where named
    assert _digest(by_alias) not in (before[0], patched[0])
    assert _digest(by_path) not in (before[1], patched[1])
    monkeypatch.undo()
    assert [_digest(by_alias), _digest(by_path), _step_key()] == before

    monkeypatch.setattr(torch.Tensor, "double_it", lambda self: self * 2, raising=False)
    assert "torch.Tensor.double_it" in fingerprint.replaced_library_attributes()


def test_attributes_read_with_getattr_and_through_submodules_enter_the_key():
    settings = __import__("types").ModuleType("settings")
    settings.scale = 1.0
    settings.inner = __import__("types").ModuleType("settings.inner")
    settings.inner.factor = 3
    namespace = {"settings": settings}
    exec(
        "def by_getattr(x):\n    return x * getattr(settings, 'scale')\n"
        "def by_path(x):\n    return x * settings.inner.factor\n",
        namespace,
    )
    first = [_digest(namespace["by_getattr"]), _digest(namespace["by_path"])]
    settings.scale = 2.0
    settings.inner.factor = 4
    assert _digest(namespace["by_getattr"]) != first[0]
    assert _digest(namespace["by_path"]) != first[1]


def test_files_the_capture_opens_are_recorded_and_checked(tmp_path):
    config = tmp_path / "scale.txt"
    config.write_text("2.0")

    def step(x):
        with open(config) as f:
            return x * float(f.read())

    with graph_cache.watching_capture() as record:
        captured = capture_step(step, [], [torch.ones(2)])
    assert str(config) in record.read and record.problem is None
    assert graph_cache.store(str(tmp_path / "g"), KEY, captured, {}, read_files=record.read)
    assert graph_cache.load(str(tmp_path / "g"), KEY, [], [torch.ones(2)]) is not None
    config.write_text("3.0")
    assert graph_cache.load(str(tmp_path / "g"), KEY, [], [torch.ones(2)]) is None
    config.unlink()  # deleted: a miss too
    assert graph_cache.load(str(tmp_path / "g"), KEY, [], [torch.ones(2)]) is None


def test_a_capture_that_writes_a_file_or_draws_global_random_numbers_is_flagged(tmp_path):
    import random

    with graph_cache.watching_capture() as record:
        (tmp_path / "log.txt").write_text("traced")
    assert "for writing" in record.problem
    with graph_cache.watching_capture() as record:
        random.random()
    assert "random" in record.problem
    with graph_cache.watching_capture() as record:
        np.random.rand()
    assert "random" in record.problem
    with graph_cache.watching_capture() as record:
        pass
    assert record.problem is None and not record.read


# ------------------------------------------------------------- the key's parts, a miss
def _parted(**values):
    """A key whose caller's parts are ``values`` (each one part), for the step "s"."""
    fp = Fingerprinter()
    for label, value in values.items():
        fp.add(label, value)
    return graph_cache.step_key(
        fp,
        [],
        [torch.ones(2)],
        {"grad_mode": True},
        {},
        {"backend type": "CPU"},
        step="s in train.py",
    )


def test_the_key_is_named_parts_and_its_digest_covers_them():
    key = _parted(models=[1, 2], optimizers={"lr": 0.1})
    names = [name for name, _ in key.parts]
    assert len(set(names)) == len(names)
    for name in (
        "version of format",
        "version of torch",
        "models",
        "optimizers",
        "decompositions",
        "library attributes replaced by user code",
        "command line",
        "working directory",
        "state layout",
        "inputs",
        "program signature: grad_mode",
        "torch grad mode",
        "backend type",
    ):
        assert name in names, name
    same, other = (
        _parted(models=[1, 2], optimizers={"lr": 0.1}),
        _parted(models=[1, 2], optimizers={"lr": 0.2}),
    )
    assert same == key and same.digest == key.digest == str(key)
    assert other.digest != key.digest and other.differences(key.parts) == ["optimizers"]
    shortened = [(name, digest[: explain.SHORT]) for name, digest in key.parts]
    assert other.differences(shortened) == ["optimizers"]
    assert key.differences(shortened + [("gone away", "0" * 16)]) == ["gone away (gone)"]


def test_a_part_changes_with_what_it_holds_not_with_the_parts_before_it():
    """An object met again is a reference to where it was first described: a value inside
    it changes that part alone, and a part that only refers to it stays as it was."""
    shared = {"lr": 0.1}

    def parts(first, second):
        fp = Fingerprinter()
        fp.add("first", first)
        fp.add("second", second)
        return dict(fp.parts)

    before = parts([shared], {"holds": shared, "own": 1})
    shared["lr"] = 0.2
    after = parts([shared], {"holds": shared, "own": 1})
    assert after["first"] != before["first"] and after["second"] == before["second"]
    assert parts([shared], {"holds": shared, "own": 2})["first"] == after["first"]


NAMED = 1.0


def test_a_users_function_is_a_part_per_free_variable_and_global_then_its_code():
    settings = types.ModuleType("settings")
    settings.scale = 1.0
    namespace = {"settings": settings, "NAMED": 1.0, "__name__": "user_script"}
    exec(
        "def make(k):\n"
        "    def step(x):\n"
        "        return x * k * NAMED * settings.scale\n"
        "    return step\n",
        namespace,
    )

    def parts(step):
        fp = Fingerprinter()
        fp.add_function("step function", step)
        return dict(fp.parts)

    base = parts(namespace["make"](2))
    assert list(base) == [
        "step function's free variable k",
        "step function's global NAMED",
        "step function's global settings",
        "step function",
    ]

    def changed(after):
        return [name for name in base if after[name] != base[name]]

    assert changed(parts(namespace["make"](3))) == ["step function's free variable k"]
    namespace["NAMED"] = 2.0
    assert changed(parts(namespace["make"](2))) == ["step function's global NAMED"]
    namespace["NAMED"] = 1.0
    settings.scale = 2.0  # an attribute the code names of a module it names
    assert changed(parts(namespace["make"](2))) == ["step function's global settings"]
    settings.scale = 1.0
    exec(
        "def make(k):\n"
        "    def step(x):\n"
        "        return x * k * NAMED * settings.scale + 0\n"
        "    return step\n",
        namespace,
    )
    assert changed(parts(namespace["make"](2))) == ["step function"]
    # As one part, the same function fingerprints the same values.
    one = Fingerprinter()
    one.add("step function", namespace["make"](2))
    other = Fingerprinter()
    other.add("step function", namespace["make"](3))
    assert one.hexdigest() != other.hexdigest()


def test_a_setting_or_module_state_declared_for_the_key_is_a_part_of_its_own():
    """JAX's ``include_in_jit_key``: a setting declares it where it is defined, and so
    does a module's own state; neither is listed anywhere else."""
    from jax_backend import config

    layer = config.Config("test_layer")
    try:
        layer.define(
            "traced_knob",
            1,
            "A knob a trace reads.",
            check=config.positive_int,
            include_in_graph_key=True,
        )
        layer.define("run_knob", 1, "A knob only a run reads.", check=config.positive_int)
        state = {"mode": "a"}
        layer.include_in_graph_key("test layer's mode", lambda: dict(state))
        base = _parted()
        names = [name for name, _ in base.parts]
        assert "setting test_layer.traced_knob" in names and "test layer's mode" in names
        assert not [name for name in names if "run_knob" in name]
        layer.update("traced_knob", 2)
        assert _parted().differences(base.parts) == ["setting test_layer.traced_knob"]
        layer.update("traced_knob", 1)
        layer.update("run_knob", 2)
        state["mode"] = "b"
        assert _parted().differences(base.parts) == ["test layer's mode"]
        with pytest.raises(ValueError, match="declared twice"):
            layer.include_in_graph_key("test layer's mode", lambda: None)
    finally:
        del layer
        gc.collect()
    assert "test_layer" not in [each.layer for each in config.layers()]


def test_turning_the_diagnostics_on_leaves_the_key_alone(monkeypatch):
    monkeypatch.delenv("CSTORCH_GRAPH_CACHE_EXPLAIN", raising=False)
    before = _parted()
    monkeypatch.setenv("CSTORCH_GRAPH_CACHE_EXPLAIN", "1")
    assert explain.explaining() and _parted() == before


def _miss_messages(caplog):
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "jax_backend.graph_cache" and "graph cache miss" in r.getMessage()
    ]


def test_a_miss_names_the_part_that_differs_from_the_steps_stored_entry(
    tmp_path, caplog, monkeypatch
):
    captured, state, inputs = _captured()
    cold = _parted(models=[1, 2], optimizers={"lr": 0.1})
    assert graph_cache.store(str(tmp_path), cold, captured, {})
    monkeypatch.delenv("CSTORCH_GRAPH_CACHE_EXPLAIN", raising=False)
    caplog.set_level(logging.DEBUG, logger="jax_backend.graph_cache")

    def miss(key):
        caplog.clear()
        assert graph_cache.load(str(tmp_path), key, [state["w"], state["b"]], list(inputs)) is None
        (message,) = _miss_messages(caplog)
        return message, caplog.records[-1].levelno

    message, level = miss(_parted(models=[1, 2], optimizers={"lr": 0.2}))
    assert level == logging.DEBUG and "s in train.py" in message
    assert message.endswith("differs from the step's stored entry in 1 part: optimizers")

    monkeypatch.setenv("CSTORCH_GRAPH_CACHE_EXPLAIN", "1")  # the user's diagnostics
    monkeypatch.setenv("CSTORCH_TEST_NEW_VARIABLE", "x")
    message, level = miss(_parted(models=[1, 3], optimizers={"lr": 0.1}))
    assert level == logging.WARNING
    assert message.endswith(
        "in 2 parts: models, environment variable CSTORCH_TEST_NEW_VARIABLE (new)"
    )
    monkeypatch.delenv("CSTORCH_TEST_NEW_VARIABLE")

    # Several entries of the step (its programs): the nearest one is compared with.
    assert graph_cache.store(
        str(tmp_path), _parted(models=[9], optimizers={"lr": 0.5}), captured, {}
    )
    message, _ = miss(_parted(models=[9], optimizers={"lr": 0.6}))
    assert message.endswith(
        "differs from the step's nearest of 2 stored entries in 1 part: optimizers"
    )
    assert (
        graph_cache.load(str(tmp_path), cold, [state["w"], state["b"]], list(inputs)) is not None
    )  # and the first still hits
    graph_cache.discard(str(tmp_path), cold.digest)
    message, _ = miss(cold)
    assert message.endswith("the step's entry under this key was removed")
    other_step = graph_cache.StepKey(cold.parts, step="another step in train.py")
    message, _ = miss(other_step)
    assert message.endswith("no entry of this step is stored")


def test_a_steps_record_keeps_its_last_keys_and_explains_nothing_when_foreign(tmp_path, caplog):
    captured, state, inputs = _captured()
    for i in range(explain.HISTORY + 3):
        key = _parted(optimizers={"lr": 1000 + i + 0.5})
        assert graph_cache.store(str(tmp_path), key, captured, {})
    (record,) = tmp_path.glob("*.step")
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    secret = (tmp_path / graph_cache.SECRET).read_bytes()
    entries = explain.recorded(str(tmp_path), secret, "s in train.py")
    assert len(entries) == explain.HISTORY
    assert "1000.5" not in record.read_text(errors="replace")  # names and digests only

    caplog.set_level(logging.DEBUG, logger="jax_backend.graph_cache")
    data = bytearray(record.read_bytes())
    data[-3] ^= 1  # the HMAC no longer matches
    record.write_bytes(bytes(data))
    assert (
        graph_cache.load(
            str(tmp_path), _parted(optimizers={"lr": -1}), [state["w"], state["b"]], list(inputs)
        )
        is None
    )
    assert _miss_messages(caplog)[-1].endswith("no entry of this step is stored")
    assert graph_cache.store(str(tmp_path), _parted(optimizers={"lr": -1}), captured, {})
    assert len(explain.recorded(str(tmp_path), secret, "s in train.py")) == 1  # replaced
