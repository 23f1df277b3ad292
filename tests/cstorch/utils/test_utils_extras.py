"""cstorch.utils.tensorboard, utils.nest, utils.benchmark, cstorch.profiler and
cstorch.experimental and the eval example."""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import struct

import cerebras.pytorch.utils.tensorboard as tensorboard
import pytest
import torch
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c, masked_crc32c

import cerebras.pytorch as cstorch
from cstorch.utils import nest
from cstorch.utils.data import DataExecutor, DataLoader
from cstorch.utils.tensorboard.event_file import read_events, read_records
from tests.paths import EXAMPLES

pytestmark = pytest.mark.core


# ------------------------------------------------------------------------ tensorboard
def test_crc32c_known_answers():
    """The checksum the reader checks records with (tensorboard's) is CRC-32C."""
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"") == 0 and crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4


def test_event_files_read_to_a_truncated_tail_and_refuse_a_corrupt_record(tmp_path):
    """Scalars as torch writes them, as ``simple_value`` or as a one-float tensor, read back;
    a file cut short (still being written) reads up to its last whole record; a record whose
    checksum or content is wrong raises."""
    with tensorboard.SummaryWriter(log_dir=str(tmp_path / "run")) as writer:
        writer.add_scalar("plain", 0.5, 1)
        writer.add_scalar("tensor", 0.25, 2, new_style=True)
    (path,) = (tmp_path / "run").glob("events.out.tfevents.*")
    reader = tensorboard.SummaryReader(str(tmp_path / "run"))
    assert [(s.step, s.value) for s in reader.read_scalar("plain")] == [(1, 0.5)]
    assert [(s.step, s.value) for s in reader.read_scalar("tensor")] == [(2, 0.25)]
    events = list(read_events(str(path)))
    assert events[0].file_version.startswith("brain.Event") and len(events) == 3
    raw = path.read_bytes()
    cut = tmp_path / "cut" / path.name
    cut.parent.mkdir()
    cut.write_bytes(raw[:-3])
    assert len(list(read_records(str(cut)))) == 2
    corrupt = tmp_path / "corrupt"
    corrupt.write_bytes(raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:])
    with pytest.raises(ValueError, match="Corrupt record data"):
        list(read_records(str(corrupt)))
    data = b"\xff" * 3  # not a protobuf message
    framed = (
        struct.pack("<Q", 3)
        + struct.pack("<I", masked_crc32c(struct.pack("<Q", 3)))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )
    (tmp_path / "garbage").write_bytes(framed)
    with pytest.raises(ValueError, match="Corrupt event"):
        list(read_events(str(tmp_path / "garbage")))


def test_summary_writer_writes_tfrecords_and_cs_summaries(tmp_path):
    with tensorboard.SummaryWriter(log_dir=str(tmp_path / "run"), base_step=3) as writer:
        for step in range(4):
            writer.add_scalar("loss/train", torch.tensor(1.0 / (step + 1)), step)
        writer.add_scalars("lr", {"a": 0.1, "b": 0.2}, 2)
        writer.add_text("note", "hello", 1)
        writer.add_tensor("weights", torch.arange(3.0), 2)
        writer.add_tensor("weights", torch.arange(3.0) * 2, 2)
    assert writer.base_step == 3 and writer.log_dir == str(tmp_path / "run")
    events = [name for name in os.listdir(writer.log_dir) if "tfevents" in name]
    cs_dirs = [name for name in os.listdir(writer.log_dir) if "csevents" in name]
    assert len(events) == 1 and cs_dirs == [events[0].replace("tfevents", "csevents")]
    metadata = json.loads((tmp_path / "run" / cs_dirs[0] / "__metadata__").read_text())
    assert metadata == {"__version__": 1.1}
    # Every record is framed as TFRecord: length, masked CRC of it, data, masked CRC of it.
    raw = (tmp_path / "run" / events[0]).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert struct.unpack("<I", raw[8:12])[0] == masked_crc32c(raw[:8])
    assert struct.unpack("<I", raw[12 + length : 16 + length])[0] == masked_crc32c(
        raw[12 : 12 + length]
    )
    # version + 4 scalars + 1 text (add_scalars writes to per-tag child writers)
    assert len(list(read_records(str(tmp_path / "run" / events[0])))) == 6

    reader = tensorboard.SummaryReader(str(tmp_path))
    scalars = reader.read_scalar("loss/train")
    assert [s.step for s in scalars] == [0, 1, 2, 3]
    assert [round(s.value, 6) for s in scalars] == [1.0, 0.5, 0.333333, 0.25]
    assert reader.read_scalar("loss/train", 2).value == pytest.approx(1 / 3)
    assert reader.Scalars("loss/train") == scalars
    assert reader.scalar_names() == {"loss/train", "lr"}
    with pytest.raises(KeyError):
        reader.read_scalar("loss/train", 9)
    with pytest.raises(RuntimeError, match="Valid scalar names"):
        reader.read_scalar("accuracy")
    assert reader.text_summary_names() == {"note"} and reader.read_text_summary("note", 1) == [
        "hello"
    ]
    assert reader.tensor_names() == {"weights"}
    latest = reader.read_tensor("weights", 2)
    assert latest.step == 2 and torch.equal(latest.tensor, torch.arange(3.0) * 2)
    assert len(reader.read_tensor("weights", 2, latest_only=False)) == 2
    assert set(reader.read_tensor("weights")) == {2}
    with pytest.warns(UserWarning):
        assert reader.read_tensor("missing") is None
    assert "loss/train" in next(iter(reader.Tags().values()))["scalars"]


def test_summary_reader_needs_event_files(tmp_path):
    with pytest.raises(RuntimeError, match="No event files"):
        tensorboard.SummaryReader(str(tmp_path))


def test_summary_writer_from_a_step_closure(cpu_backend, tmp_path):
    writer = tensorboard.SummaryWriter(log_dir=str(tmp_path / "tb"))
    compiled = cstorch.compile(torch.nn.Identity(), cpu_backend)

    @cstorch.step_closure
    def log(loss, step):
        writer.add_scalar("loss", loss, step)

    @cstorch.trace
    def step_fn(x):
        loss = compiled(x).sum()
        log(loss, 0)
        return loss

    for _i, x in enumerate(
        DataExecutor(DataLoader(lambda: [torch.ones(2) * k for k in range(3)]), num_steps=3)
    ):
        step_fn(x)
    writer.close()
    assert [
        s.value for s in tensorboard.SummaryReader(str(tmp_path / "tb")).read_scalar("loss")
    ] == [0.0, 2.0, 4.0]


# ------------------------------------------------------------------------ nest
def test_nest_visit_map_recurse_and_diff():
    Point = collections.namedtuple("Point", "x y")
    structure = {"a": [torch.ones(1), 3], "b": {"c": Point(torch.zeros(2), "s")}}
    assert [(scope, t.shape) for scope, t in nest.visit_torch_tensors(structure)] == [
        (["a", "0"], (1,)),
        (["b", "c", "0"], (2,)),
    ]
    with pytest.raises(ValueError):
        list(nest.visit_torch_tensors({"a": 3}, strict=True))
    mapped = nest.map_torch_tensors(lambda scope, t: ".".join(scope), structure)
    assert mapped["a"] == ["a.0", 3] and mapped["b"]["c"].x == "b.c.0"
    _, spec = torch.utils._pytree.tree_flatten(structure)
    assert [".".join(s) for s in nest.recurse_spec(spec)] == ["a.0", "a.1", "b.c.0", "b.c.1"]
    assert list(nest.diff(structure, structure)) == []
    differences = list(
        nest.diff({"a": 1, "b": torch.ones(2)}, {"a": 2, "b": torch.ones(2), "c": 0})
    )
    assert len(differences) == 2 and "'c'" in differences[0] and "a: 1 != 2" in differences[1]


def test_nest_register_visit_fn():
    class Bag:
        def __init__(self, **items):
            self.items = items

    @nest.register_visit_fn(Bag)
    def visit_bag(bag):
        for key, value in bag.items.items():
            yield [key], value

    try:
        found = list(nest.visit_torch_tensors(Bag(w=torch.ones(1), n=[torch.zeros(1)])))
        assert [scope for scope, _ in found] == [["w"], ["n", "0"]]
    finally:
        nest.unregister_visit_fn(Bag)
    with pytest.raises(TypeError):
        nest.register_visit_fn("not a type")


# ------------------------------------------------------------------------ benchmark
def test_benchmark_dataloader(capsys):
    def input_fn():
        return [(torch.zeros(4, 2), torch.ones(4)) for _ in range(5)]

    metrics = cstorch.utils.benchmark.benchmark_dataloader(
        input_fn,
        num_epochs=2,
        steps_per_epoch=3,
        sampling_frequency=2,
        profile_activities=["max_rss"],
    )
    assert metrics.total_steps == 6 and not metrics.is_partial
    assert [len(e.batch_metrics) for e in metrics.epoch_metrics] == [2, 2]
    assert len(metrics.batch_specs) == 1 and metrics.global_sample_rate == pytest.approx(
        metrics.global_rate * 4
    )
    assert "max_rss" in metrics.epoch_metrics[0].batch_metrics[0].profile_activities
    assert "steps: 6" in capsys.readouterr().out
    with pytest.raises(ValueError):
        cstorch.utils.benchmark.benchmark_dataloader(input_fn, profile_activities=["gpu"])
    with pytest.raises(ValueError):
        cstorch.utils.benchmark.benchmark_dataloader(input_fn, num_epochs=0)


# ------------------------------------------------------------------------ profiler
def test_profiler_schedule_and_registry(cpu_backend):
    with pytest.raises(ValueError):
        cstorch.profiler.schedule(start_step=5, end_step=2)
    with cstorch.profiler.profile(schedule=cstorch.profiler.schedule(start_step=1, end_step=2)):
        with pytest.raises(RuntimeError, match="already been set"):
            with cstorch.profiler.profile(
                schedule=cstorch.profiler.schedule(start_step=1, end_step=1)
            ):
                pass
        with pytest.raises(RuntimeError, match="Only CSX backend can be profiled"):
            list(DataExecutor(DataLoader(lambda: [torch.zeros(1)]), num_steps=2))
    assert cstorch.profiler.ProfilerRegistry.get_profiler() is None
    with cstorch.profiler.profile(schedule=cstorch.profiler.schedule(start_step=-1, end_step=2)):
        list(DataExecutor(DataLoader(lambda: [torch.zeros(1)]), num_steps=2))


def test_profiler_records_scheduled_steps_on_csx(tmp_path):
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path))
    compiled = cstorch.compile(torch.nn.Linear(2, 2), backend)

    @cstorch.trace
    def step(x):
        return compiled(x).sum()

    ready = []
    with cstorch.profiler.profile(
        schedule=cstorch.profiler.schedule(start_step=2, end_step=3), on_trace_ready=ready.append
    ) as prof:
        with pytest.raises(ValueError, match="range"):
            prof.configure_profiler(True, num_steps=2)
        for x in DataExecutor(DataLoader(lambda: [torch.ones(4, 2)] * 4), num_steps=4):
            step(x)
    assert ready == [prof]
    assert [e["name"] for e in prof.trace_events] == ["step 2", "step 3"]
    assert "step 3" in prof.get_summary()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    assert len(json.loads((tmp_path / "trace.json").read_text())["traceEvents"]) == 2


def test_tensorboard_trace_handler_requires_the_plugin():
    handler = cstorch.profiler.tensorboard_trace_handler("logs")
    schedule = cstorch.profiler.schedule(start_step=1, end_step=1)
    if importlib.util.find_spec("torch_tb_profiler") is None:
        with pytest.raises(ImportError, match="torch_tb_profiler"):
            cstorch.profiler.profile(schedule=schedule, on_trace_ready=handler)


# ------------------------------------------------------------------------ experimental
def test_compression_validates_and_annotates(cpu_backend):
    from cstorch.experimental.compression import compression_format

    with pytest.raises(TypeError):
        cstorch.experimental.Compression(8, "*")
    with pytest.raises(ValueError):
        cstorch.experimental.Compression("mx7", "*")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    compression = cstorch.experimental.Compression("mx8-e3m4", ["0.*"])
    cstorch.compile(model, cpu_backend)
    model.apply(compression)  # compile lets module.apply take objects with an apply method
    assert compression_format(model[0].weight) == "mx8-e3m4"
    assert compression_format(model[1].weight) is None
    assert "mx8-e3m4" in repr(compression)


def test_implicit_loop_functions(cpu_backend):
    x = torch.arange(12, dtype=torch.int32).view(2, 6)
    index = torch.tensor([[1], [4]], dtype=torch.int32)  # (batch, position along dim 1)
    assert cstorch.experimental.get_loop_iteration_slice(x, index).tolist() == [[1], [10]]
    with pytest.raises(TypeError, match="int32"):
        cstorch.experimental.start_implicit_loop(x.long(), 1)
    with pytest.raises(NotImplementedError, match="CPU backend"):
        cstorch.experimental.start_implicit_loop(x, 1)
    args = (x, index, x[:, :1], x[:, :1])
    with pytest.raises(ValueError, match="start_token"):
        cstorch.experimental.update_implicit_loop(*args, start_token=-1)
    with pytest.raises(NotImplementedError):
        cstorch.experimental.update_implicit_loop(*args, start_token=[1, 2], max_tokens=4)


def test_traced_tensor_hook_names_the_step_tensors(cpu_backend):
    seen = []
    handle = cstorch.experimental.listener.register_traced_tensor_hook(
        lambda tensor, name: seen.append((name, tuple(tensor.shape)))
    )
    compiled = cstorch.compile(torch.nn.Linear(3, 2), cpu_backend)

    @cstorch.trace
    def step(x):
        y = compiled(x)
        return torch.relu(y).sum() + torch.relu(y).sum()

    try:
        step(torch.ones(4, 3))
    finally:
        handle.remove()
    assert seen == [
        ("linear", (4, 2)),
        ("relu", (4, 2)),
        ("sum", ()),
        ("relu.1", (4, 2)),
        ("sum.1", ()),
        ("add", ()),
    ]


# ------------------------------------------------------------------------ example
@pytest.mark.slow
def test_eval_example_runs_and_prints_the_accuracy(capsys, tmp_path):
    spec = importlib.util.spec_from_file_location(
        "eval_accuracy", os.path.join(EXAMPLES, "eval_accuracy.py")
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    accuracy = example.main(str(tmp_path))
    printed = capsys.readouterr().out
    assert f"Accuracy: {accuracy}" in printed
    # The same accuracy, computed eagerly from the saved weights.
    model = torch.nn.Sequential(
        torch.nn.Linear(example.FEATURES, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, example.NUM_CLASSES),
    )
    model.load_state_dict(cstorch.load(str(tmp_path / "checkpoint.mdl"))["model"])
    inputs, labels = example.make_dataset(320, 2).tensors
    with torch.no_grad():
        expected = (model(inputs).argmax(-1) == labels).float().mean().item()
    assert accuracy == pytest.approx(expected) and 0.5 < accuracy <= 1.0
