"""The cerebras.pytorch / cerebras.appliance surface the Cerebras Model Zoo relies on.

Each test checks one name or behaviour the zoo's Trainer, callbacks or models use, against the
reference's observable behaviour (fixtures made with cerebras-pytorch 2.10 where numbers are
involved). The zoo itself is exercised by tests/zoo (opt-in, it needs a zoo checkout).
"""

import dataclasses
import inspect
import json
import logging
import os
import pathlib
import threading
import typing

import pytest
import torch
from torch.optim.optimizer import ParamsT as TorchParamsT

import cerebras.pytorch as cstorch
from cstorch.utils.data import DataExecutor, DataLoader, Schedule
from tests import paths

DATA = pathlib.Path(paths.DATA)


# ------------------------------------------------------------------------ names
def test_generating_docs_flag_is_false_outside_doc_builds():
    assert cstorch._generating_docs is False


def test_call_once_runs_once_and_reports_repeats():
    from cerebras.pytorch.utils.call_once import call_once

    calls, repeats = [], []

    @call_once(lambda: repeats.append(1))
    def setup(x):
        calls.append(x)
        return x * 2

    assert setup(3) == 6 and setup(4) == 6 and setup(5) == 6
    assert calls == [3] and len(repeats) == 2

    @call_once()
    def slow():
        calls.append("slow")
        return object()

    results = []
    threads = [threading.Thread(target=lambda: results.append(slow())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls.count("slow") == 1 and len({id(r) for r in results}) == 1


def test_param_filters_from_globs_and_callables():
    from cerebras.pytorch.utils.utils import (
        FilterCallable,
        convert_glob_to_regex,
        make_param_filter,
    )

    assert convert_glob_to_regex("*.weight").fullmatch("fc.0.weight")
    with pytest.raises(TypeError):
        convert_glob_to_regex(3)
    p = torch.nn.Parameter(torch.zeros(1))
    f = make_param_filter(["*.weight", "emb*"])
    assert f("fc.weight", p) and f("embedding.x", p) and not f("fc.bias", p)
    assert make_param_filter("fc.bias")("fc.bias", p) and not make_param_filter("fc")("fc.b", p)
    fn = lambda name, param: name == "x"  # noqa: E731
    assert make_param_filter(fn) is fn
    with pytest.raises(ValueError, match="callable taking"):
        make_param_filter(lambda name: True)
    assert typing.get_origin(FilterCallable) is not None  # a Callable[[str, Parameter], bool]


def test_annotation_configs_create_decorators(cpu_backend):
    from cerebras.pytorch.core.annotation import (
        AnnotationMode,
        create_annotation,
        current_annotation,
    )

    @dataclasses.dataclass
    class Recompute(AnnotationMode.Config):
        level: typing.Optional[int] = None
        enable_fwd: bool = True
        enable_bwd: bool = True

        def __post_init__(self):
            if self.level is not None and self.level < 0:
                raise ValueError("level")

    def attribute(config, is_backward):
        return AnnotationMode.Attribute("recompute", config.level)

    with pytest.warns(UserWarning, match="doesn't have any effect"):  # off CSX, as the reference
        decorate = create_annotation(Recompute, attribute, level=2)
    seen = []
    fn = decorate(lambda: seen.append(current_annotation("recompute")))
    fn()
    assert seen == [2] and current_annotation("recompute") is None
    with pytest.raises(ValueError, match="level"):  # the config validates at creation
        create_annotation(Recompute, attribute, level=-1)
    with pytest.raises(TypeError, match="AnnotationMode.Config"):
        create_annotation(dict, attribute)
    identity = create_annotation(Recompute, attribute, level=None)  # value None tags nothing
    assert identity(len) is len


def test_annotation_modes_apply_with_annotate(cpu_backend):
    """The 2.1-2.4 form the 2.4 Model Zoo's ``named_matmul`` uses: an AnnotationMode
    subclass with a class-wide config, instantiated with its config, applied by annotate."""
    from cerebras.pytorch.core.annotation import AnnotationMode, annotate, current_annotation

    class Named(AnnotationMode):
        @dataclasses.dataclass
        class NamedConfig(AnnotationMode.Config):
            name: typing.Optional[str]

        _named = None

        @property
        def config(self):
            return Named._named

        @config.setter
        def config(self, config):
            Named._named = config

        def get_attribute(self, config, is_backward):
            return AnnotationMode.Attribute("named", f"{config.name}.fwd")

    def named(name, enable_fwd=True):
        return annotate(Named(Named.NamedConfig(name=name, enable_fwd=enable_fwd, enable_bwd=True)))

    seen = []

    def look():
        seen.append((current_annotation("named"), Named._named and Named._named.name))

    with pytest.warns(UserWarning, match="Named .*doesn't have any effect"):  # off CSX
        outer, inner, off = named("outer"), named("inner"), named("off", enable_fwd=False)
    run = outer(lambda: (look(), inner(look)(), off(look)(), look()))
    run()
    assert seen == [
        ("outer.fwd", "outer"),
        ("inner.fwd", "inner"),
        (None, "off"),
        ("outer.fwd", "outer"),
    ]
    assert current_annotation("named") is None and Named._named is None  # all restored
    with pytest.raises(TypeError, match="AnnotationMode instance"):
        annotate(Named.NamedConfig(name="x", enable_fwd=True, enable_bwd=True))
    with pytest.raises(TypeError, match="Config instance"):
        Named({"name": "x"})
    with pytest.raises(TypeError):  # the abstract base is not an annotation by itself
        AnnotationMode(Named.NamedConfig(name="x", enable_fwd=True, enable_bwd=True))


def test_annotate_needs_a_backend():
    from cerebras.pytorch.backend import current_backend_impl
    from cerebras.pytorch.core.annotation import AnnotationMode, annotate

    class Plain(AnnotationMode):
        config = None

        def get_attribute(self, config, is_backward):
            return AnnotationMode.Attribute("plain", 1)

    assert current_backend_impl(raise_exception=False) is None
    with pytest.raises(RuntimeError, match="No active Cerebras backend"):
        annotate(Plain(AnnotationMode.Config(enable_fwd=True, enable_bwd=True)))


def test_kernel_and_kv_group_annotaters():
    from cerebras.pytorch.utils.kernel import KernelConfig, kernel_annotater
    from cerebras.pytorch.utils.num_kv_groups import GroupsConfig, groups_annotater

    assert kernel_annotater("flash")(len) is len  # identity off CSX
    assert groups_annotater(2)(len) is len
    with pytest.raises(TypeError):
        KernelConfig(kernel=3)
    with pytest.raises(TypeError):
        GroupsConfig(num_kv_groups="2")


def test_kernel_annotater_tags_ops_on_csx(tmp_path):
    from cerebras.pytorch.core.annotation import current_annotation
    from cerebras.pytorch.utils.kernel import kernel_annotater

    cstorch.backend("CSX", artifact_dir=str(tmp_path))
    seen = []
    kernel_annotater("flash")(lambda: seen.append(current_annotation("kernel")))()
    assert seen == ["flash"]


def test_cerebras_pytorch_lib_records_attributes():
    from cerebras.pytorch.lib import cerebras_pytorch_lib

    assert cstorch.cerebras_pytorch_lib is cerebras_pytorch_lib
    t = torch.zeros(2)
    cerebras_pytorch_lib.set_attribute(t, "cs.internal", {"source_vars": ["x"]})
    assert cerebras_pytorch_lib.get_attributes(t) == {"cs.internal": {"source_vars": ["x"]}}
    with pytest.raises(AttributeError, match="native lazy-tensor library"):
        cerebras_pytorch_lib.get_appliance_data


def test_cirh_ops_exist_and_refuse_to_run():
    assert cstorch.cirh is torch.ops.cirh
    with pytest.raises(NotImplementedError, match="torch.topk"):
        cstorch.cirh.FusedTopK(torch.rand(2, 5), k=2, dimension=1)
    assert callable(cstorch.cirh.FusedTopP)


def test_cluster_and_task_specs():
    from cerebras.pytorch.distributed.cluster_resolver import ClusterSpec, TaskRole, TaskSpec

    task = TaskSpec(rank=0, local_rank=0, wse_id=0, node_name="unknown", roles=[TaskRole.MASTER])
    spec = ClusterSpec([task], 0, 1, 1)
    assert spec.task() is task and spec.num_tasks() == 1
    assert spec.filter_tasks_by_role(TaskRole.MASTER) == [task]
    with pytest.raises(ValueError, match="Invalid task rank"):
        spec.task(3)
    with pytest.raises(ValueError):
        TaskSpec(rank=-1, local_rank=0, wse_id=0, node_name="n")
    with pytest.raises(ValueError, match="ranks must be"):
        ClusterSpec([TaskSpec(1, 0, 0, "n")], 0, 1, 1)
    assert cstorch.distributed.WORKER_CACHE_ROOT == "/n0/cache"
    # the zoo's GPU-distributed data paths ask these (they are not in the reference)
    assert not torch.distributed.is_initialized()
    assert cstorch.distributed.get_rank() == 0 and cstorch.distributed.get_world_size() == 1
    # the single-host run's own spec uses the same classes
    assert isinstance(cstorch.distributed.service_resolver().cluster_spec, ClusterSpec)


def test_type_hint_names():
    from cerebras.pytorch.optim.optimizer import ParamsT
    from cerebras.pytorch.utils.data.data_executor import MbsSetting

    assert ParamsT is TorchParamsT
    assert typing.Literal["explore", "auto"] in typing.get_args(MbsSetting)


def test_debug_args_merge_like_protobuf_messages():
    debug_args = cstorch.backends.csx.debug.debug_args
    debug_args.MergeFrom({"debug_usr": {"a": 1, "labels": ["x"]}})
    debug_args.MergeFrom({"debug_usr": {"b": 2, "labels": ["y"]}, "ini": {"k": True}})
    assert debug_args == {"debug_usr": {"a": 1, "b": 2, "labels": ["x", "y"]}, "ini": {"k": True}}
    with pytest.raises(TypeError):
        debug_args.MergeFrom(3)
    cstorch.backends.csx.debug.debug_args = {}


# ------------------------------------------------------------------------ behaviours
def test_trace_on_a_method_binds_self(cpu_backend):
    class Trainer:
        def __init__(self, scale):
            self.scale = scale
            self.model = cstorch.compile(torch.nn.Identity(), cpu_backend)

        @cstorch.trace
        def step(self, x):
            return self.model(x).sum() * self.scale

    a, b = Trainer(2.0), Trainer(3.0)
    outputs = []
    for x in DataExecutor(DataLoader(lambda: [torch.ones(2)] * 2), num_steps=2):
        outputs.append((float(a.step(x)), float(b.step(x))))
    assert outputs == [(4.0, 6.0), (4.0, 6.0)]
    assert a.step is a.step and a.step is not b.step  # one compiled step per instance
    assert a.step.trace_count == 1 and isinstance(Trainer.step, type(a.step))


def test_compile_sets_model_device(cpu_backend):
    model = torch.nn.Linear(2, 2)
    compiled = cstorch.compile(model, cpu_backend)
    assert model.device == torch.device("cpu", 0) == compiled.device


def _signatures():
    path = DATA / "reference_constructor_signatures.json"
    return json.loads(path.read_text())["signatures"]


def _constructor_class(name):
    from cstorch.optim import lr_scheduler, optimizer, scheduler, weight_decay_scheduler

    modules = {
        "optimizer": optimizer,
        "scheduler": scheduler,
        "lr_scheduler": lr_scheduler,
        "weight_decay_scheduler": weight_decay_scheduler,
    }
    module, _, cls = name.rpartition(".")
    return getattr(modules[module] if module else cstorch.optim, cls)


@pytest.mark.parametrize("name", sorted(_signatures()))
def test_constructor_annotations_match_the_reference(name):
    cls = _constructor_class(name)
    reference = _signatures()[name]
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in params] == [r[0] for r in reference]
    # The zoo reads inspect.signature(cls.__init__) annotations directly, so they must be the
    # type objects themselves (not strings to be resolved later).
    namespace = {
        **vars(typing),
        "torch": torch,
        "ParamsT": TorchParamsT,
        "Scheduler": cstorch.optim.scheduler.Scheduler,
        "LRScheduler": cstorch.optim.lr_scheduler.LRScheduler,
    }
    for param, (pname, annotation, default) in zip(params, reference):
        if annotation is not None:
            assert param.annotation == eval(annotation, namespace), pname
        if default is None:
            assert param.default is inspect.Parameter.empty, pname
        else:
            assert param.default == eval(default), pname  # fixture literal


def test_pydantic_config_from_an_optimizer_signature(cpu_backend):
    """What the zoo does: build a config model from the constructor's annotated parameters."""
    pydantic = pytest.importorskip("pydantic")
    params = list(inspect.signature(cstorch.optim.SGD.__init__).parameters.values())[2:]
    fields = {p.name: (p.annotation, ... if p.default is p.empty else p.default) for p in params}
    Config = pydantic.create_model("SGDConfig", **fields)
    assert Config(lr=0.1).momentum == 0
    with pytest.raises(pydantic.ValidationError, match="lr"):
        Config()
    with pytest.raises(pydantic.ValidationError):
        Config(lr=0.1, nesterov="sometimes")


def test_schedule_is_a_dataclass_with_range_api():
    rng = Schedule.Range(start=9, end=20, step=10, include_last=True)
    assert list(rng) == [9, 19] and len(rng) == 2 and rng.range() == range(9, 20, 10)
    assert rng.final_step == 19 and rng.next_immediate_step(0) == 9
    assert rng.next_immediate_step(10) == 19 and rng.next_immediate_step(19) == 19
    with pytest.raises(ValueError, match="past the last step"):
        rng.next_immediate_step(20)
    no_last = Schedule.Range(start=0, end=7, step=3, include_last=False)
    assert no_last.final_step == 6 and len(no_last) == len(no_last.range()) == 3
    shifted = dataclasses.replace(rng)
    shifted.start = rng.next_immediate_step(12)  # the zoo shifts a copy's start
    assert list(shifted) == [19] and list(rng) == [9, 19]
    schedule = Schedule([rng])
    assert dataclasses.is_dataclass(schedule) and schedule.intervals == [rng]
    assert schedule == Schedule(intervals=[Schedule.Range(9, 20, 10, True)])


def test_executor_artifact_dir_is_a_path(cpu_backend):
    executor = DataExecutor(DataLoader(lambda: [torch.ones(1)]), num_steps=1)
    for _ in executor:
        assert isinstance(executor.artifact_dir, pathlib.Path)
    assert (executor.artifact_dir / "performance.json").is_file()


def test_tensorboard_writer_is_torchs_writer(tmp_path):
    from cerebras.pytorch.utils.tensorboard import SummaryReader, SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path))
    assert isinstance(writer, torch.utils.tensorboard.SummaryWriter)
    assert writer._get_file_writer() is not None  # the zoo's TensorBoardLogger reaches for it
    writer.add_histogram("w", torch.arange(10.0), 0)  # any of torch's add_* methods
    writer.add_scalar("loss", 0.5, 1)
    writer.close()
    assert [s.value for s in SummaryReader(str(tmp_path)).read_scalar("loss")] == [0.5]


def test_cluster_config_is_hashable_by_content(tmp_path):
    ClusterConfig = cstorch.distributed.ClusterConfig
    a, b = (
        ClusterConfig(num_csx=2, mount_dirs=[str(tmp_path)]),
        ClusterConfig(num_csx=2, mount_dirs=[str(tmp_path)]),
    )
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert hash(ClusterConfig(num_csx=3)) != hash(a)


def test_csx_backend_models_the_cluster(tmp_path, caplog):
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path))
    cluster = backend.cluster
    assert cluster.workflow_id is None and cluster.client is None
    assert backend.appliance is None
    with caplog.at_level(logging.INFO, logger="cerebras.pytorch.ClusterManager"):
        assert cluster.start_workflow(lock_resources=False) is True
        workflow = cluster.workflow_id
        assert workflow and backend.cluster_config.workflow_id == workflow
        assert cluster.start_workflow() is False  # already running
        assert cluster.active_resources() == 1
        cluster.config = cstorch.distributed.ClusterConfig(num_csx=1)  # keeps the workflow
        assert cluster.workflow_id == workflow
        cluster.stop_workflow()
    assert cluster.workflow_id is None and "Started local workflow" in caplog.text
    with pytest.raises(RuntimeError, match="start_workflow"):
        cluster.active_resources()
    with pytest.raises(TypeError):
        cluster.config = {}


def test_cpu_backend_has_no_cluster(cpu_backend):
    assert cpu_backend.cluster is None and cpu_backend.appliance is None


def _closure_run(backend_type, tmp_path):
    from cerebras.pytorch.backend.ltc_backend import register_after_tensor_to_cpu

    backend = cstorch.backend(backend_type, artifact_dir=str(tmp_path))
    compiled = cstorch.compile(torch.nn.Identity(), backend)
    received, seen = [], []
    handle = register_after_tensor_to_cpu(
        lambda tensor, name: received.append((name, tensor.clone()))
    )

    @cstorch.step_closure
    def record(loss):
        seen.append(float(loss))

    @cstorch.trace
    def step(x):
        loss = compiled(x).sum()
        record(loss)
        return loss

    for x in DataExecutor(DataLoader(lambda: [torch.ones(2) * k for k in range(3)]), num_steps=3):
        step(x)
    handle.remove()
    return received, seen


def test_tensor_to_cpu_hooks_fire_for_closure_values_on_csx(tmp_path):
    received, seen = _closure_run("CSX", tmp_path)
    assert seen == [0.0, 2.0, 4.0]
    assert [float(t) for _, t in received] == seen  # one host copy per closure value
    assert all(isinstance(name, str) and name for name, _ in received)


def test_tensor_to_cpu_hooks_stay_silent_off_csx(tmp_path):
    received, seen = _closure_run("CPU", tmp_path)
    assert seen == [0.0, 2.0, 4.0] and received == []


def test_scheduler_and_optimizer_step_counts_follow_each_step(cpu_backend):
    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model, cpu_backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = cstorch.optim.lr_scheduler.LinearLR(optimizer, 0.1, 0.0, total_iters=10)
    assert (optimizer._step_count, scheduler._step_count) == (0, 1)  # the constructor's step

    @cstorch.trace
    def step(x):
        loss = compiled(x).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        return loss

    for x in DataExecutor(DataLoader(lambda: [torch.ones(3, 2)] * 4), num_steps=4):
        step(x)
    # as in the reference, where the (eager) step body runs on every call
    assert (optimizer._step_count, scheduler._step_count) == (4, 5)
    assert scheduler.state_dict()["_step_count"] == 5


def test_device_context_draws_random_numbers_like_the_reference():
    reference = json.loads((DATA / "device_context_random_reference.json").read_text())
    backend = cstorch.backend("CPU")
    torch.manual_seed(1)
    with backend.device:
        model = torch.nn.Sequential(torch.nn.Linear(6, 3), torch.nn.Linear(3, 2))
        r = torch.rand(3)
        values = {
            "params": [p.detach().flatten().tolist() for p in model.parameters()],
            "rand": r.tolist(),
            "randn": torch.randn(2).tolist(),
            "randint": torch.randint(0, 10, (3,)).tolist(),
            "rand_like": torch.rand_like(r).tolist(),
            "randn_like": torch.randn_like(r).tolist(),
            "randint_like": torch.randint_like(r, 0, 10).tolist(),
            "init_normal": torch.nn.init.normal_(torch.empty(2)).tolist(),
        }
    values["rand_after_exit"] = torch.rand(2).tolist()
    for key, value in values.items():
        assert value == reference[key], key


def test_device_context_nests_and_leaves_explicit_generators_alone():
    backend = cstorch.backend("CPU")
    g = torch.Generator().manual_seed(5)
    expected = torch.rand(3, generator=torch.Generator().manual_seed(5))
    with backend.device:
        with backend.device:
            explicit = torch.rand(3, generator=g)
        torch.manual_seed(0)
        first = torch.rand(2)
    torch.manual_seed(0)
    plain = torch.rand(2)
    assert torch.equal(explicit, expected)
    assert not torch.equal(first, plain)  # inside: a fresh generator, outside: the default one


# ------------------------------------------------------------------------ cerebras.appliance
def test_appliance_portion_is_a_namespace_package():
    import cerebras.appliance

    assert getattr(cerebras.appliance, "__file__", None) is None  # a real install shadows it
    compat = pathlib.Path(paths.REPO) / "compat" / "cerebras" / "appliance"
    assert not (compat / "__init__.py").exists()


def test_appliance_storage_routes_paths_and_round_trips_checkpoints(tmp_path):
    from cerebras.appliance.storage import (
        H5Reader,
        H5Writer,
        S3Reader,
        S3Writer,
        StorageDeleter,
        StorageReader,
        StorageWriter,
    )

    path = str(tmp_path / "ckpt.mdl")
    assert StorageWriter.is_valid_path(path) and not StorageWriter.path_exists(path)
    assert StorageReader.get_type("s3://bucket/ckpt.mdl") is S3Reader
    assert S3Writer.is_valid_path("s3://b/k") and not S3Writer.is_valid_path(path)
    with pytest.raises(NotImplementedError, match="S3 checkpoint storage"):
        S3Writer("s3://b/k")
    cstorch.save({"w": torch.arange(4.0)}, path)
    assert StorageReader.path_exists(path) and StorageReader.get_type(path) is H5Reader
    with H5Reader(path) as reader:
        assert reader.stats.path == path
        key = next(k for k in reader.keys() if "w" in k)
        assert reader.read_numpy(key).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert StorageDeleter.get(path).delete() is True and not os.path.exists(path)
    raw = str(tmp_path / "raw.h5")
    with H5Writer(raw) as writer:
        writer.write_numpy("x", torch.ones(2).numpy(), {})
    assert H5Reader(raw).read_numpy("x").tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError):
        with H5Writer(str(tmp_path / "aborted.h5")):
            raise RuntimeError("interrupted")
    assert not os.path.exists(tmp_path / "aborted.h5")  # nothing half-written appears


def test_appliance_utils(tmp_path):
    from cerebras.appliance.errors import ApplianceClientException, ApplianceNanError
    from cerebras.appliance.log import (
        collect_wsc_log_settings,
        get_level_name,
        named_class_logger,
        wsc_logger,
    )
    from cerebras.appliance.utils.classes import retrieve_all_subclasses
    from cerebras.appliance.utils.debug_args import get_debug_args, write_debug_args
    from cerebras.appliance.utils.file import create_symlink
    from cerebras.appliance.utils.ini import set_default_ini, set_ini
    from cerebras.appliance.utils.units import bytes_to_human, convert_byte_unit

    assert issubclass(ApplianceNanError, ApplianceClientException)
    assert get_level_name("verbose") == 15 and get_level_name(5) == "TRACE"

    @named_class_logger("Thing")
    class Thing:
        pass

    assert Thing.logger.name == "cerebras.Thing" and Thing._should_log_info() in (True, False)
    wsc_logger.getChild("execute").getChild("wrk").setLevel(logging.DEBUG)
    try:
        settings = collect_wsc_log_settings()
        assert any(
            s.mode == "execute" and s.role == "wrk" and s.level == logging.DEBUG for s in settings
        )
    finally:
        wsc_logger.getChild("execute").getChild("wrk").setLevel(logging.NOTSET)
    assert bytes_to_human(1536) == "1.5KiB" and bytes_to_human(10**6, log_base=10) == "1.0MB"
    assert convert_byte_unit(2048, "KiB") == 2
    with pytest.raises(ValueError):
        bytes_to_human(1, log_base=3)

    class Base:
        pass

    class Mid(Base):
        pass

    class Leaf(Mid):
        pass

    assert list(retrieve_all_subclasses(Base)) == [Mid, Leaf]
    link = tmp_path / "latest"
    create_symlink(link, tmp_path / "a")
    create_symlink(link, tmp_path / "b")
    assert os.readlink(link) == str(tmp_path / "b")

    debug_args = get_debug_args(None)
    set_default_ini(debug_args, ws_opt=True)
    set_default_ini(debug_args, ws_opt=False)  # a default never overrides
    set_ini(debug_args, other=3)
    assert debug_args["ini"] == {"ws_opt": True, "other": 3}
    path = tmp_path / "debug_args.json"
    write_debug_args(debug_args, str(path))
    assert get_debug_args(str(path)) == debug_args
    (tmp_path / "proto.txt").write_text("debug_usr { skip: true }")
    with pytest.raises(ValueError, match="protobuf text format"):
        get_debug_args(str(tmp_path / "proto.txt"))


def test_appliance_environ_reaches_this_process():
    from cerebras.appliance.environment import appliance_environ

    appliance_environ["CSTORCH_TEST_VAR"] = "1"
    try:
        assert os.environ["CSTORCH_TEST_VAR"] == "1" and dict(appliance_environ) == {
            "CSTORCH_TEST_VAR": "1"
        }
    finally:
        del appliance_environ["CSTORCH_TEST_VAR"]
    assert "CSTORCH_TEST_VAR" not in os.environ
    with pytest.raises(TypeError):
        appliance_environ["X"] = 1
