"""The graph cache across runs: a second run of an unchanged script reuses the captured graph
(no capture at all: the script counts calls of ``capture_step``) and computes bitwise the
same losses; any change the graph depends on captures again, and every run's losses match
eager torch, so no stale graph ever ran. Each run is a new Python process, as a user's is
(tests/fork_server.py: forked from one that has imported torch and JAX, nothing of cstorch).
The cache is off unless ``CSTORCH_GRAPH_CACHE`` names a directory (or ``on``).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import numpy as np
import pytest

from tests import fork_server
from tests.graph_cache_entries import first_node, rewrite_entry
from tests.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.core]  # fresh Python processes


PRELUDE = """
import collections, json, sys
import jax.monitoring
events = collections.Counter()
jax.monitoring.register_event_listener(
    lambda e, **_: events.update([e.rsplit("/", 1)[-1]]) if "graph_cache" in e else None)
import torch
import cerebras.pytorch as cstorch
import cstorch.core.step_capture

traces = []  # one entry per capture of a step: proves whether capture ran
_capture_step = cstorch.core.step_capture.capture_step
def counting_capture_step(*args, **kwargs):
    traces.append(1)
    return _capture_step(*args, **kwargs)
cstorch.core.step_capture.capture_step = counting_capture_step

def report(**values):
    print("RESULT " + json.dumps(dict(values, traces=len(traces), events=dict(events))))
"""

MODEL = """
import torch

class Net(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.hidden = torch.nn.Linear(8, width)
        self.out = torch.nn.Linear(width, 3)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))
"""

# A step closure defined inside main() and called by the traced step, as in gigaGPT.
TRAIN = (
    PRELUDE
    + """
from model_def import Net

STEPS = 3

def objective(out, y):
    return torch.nn.functional.cross_entropy(out, y)

def eager_losses(width, x, y, lr, precision):
    torch.manual_seed(0)
    model = Net(width)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(STEPS):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(x)
            loss = {expr}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses

def main(width, batch, lr, precision, closure_call):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, 8, generator=g), torch.randint(0, 3, (batch,), generator=g)
    eager = eager_losses(width, x, y, lr, precision)

    backend = cstorch.backend("CPU")
    if precision == "bf16":
        cstorch.amp.set_half_dtype("bfloat16")
    torch.manual_seed(0)
    model = Net(width)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=lr)
    logged = []

    @cstorch.step_closure
    def log_loss(loss, tag):
        logged.append([tag, loss.item()])

    # Reached only through a dict: no path from the step function the cache can follow.
    closures = {{"log": cstorch.step_closure(lambda loss, tag: logged.append([tag, loss.item()]))}}

    @cstorch.trace
    def training_step(x, y):
        out = compiled(x)
        loss = {expr}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if closure_call == "direct":
            log_loss(loss, "train")
        else:
            closures["log"](loss, "train")
        return loss

    loader = cstorch.utils.data.DataLoader(lambda: [(x, y)] * STEPS)
    losses = []
    for bx, by in cstorch.utils.data.DataExecutor(loader, num_steps=STEPS):
        losses.append(training_step(bx, by).item())
    report(losses=losses, logged=logged, eager=eager)

if __name__ == "__main__":
    width, batch = int(sys.argv[1]), int(sys.argv[2])
    main(width, batch, float(sys.argv[3]), sys.argv[4], sys.argv[5])
"""
)


def _run(
    tmp_path,
    cache,
    *,
    width=16,
    batch=4,
    lr=0.1,
    precision="fp32",
    closure="direct",
    expr="objective(out, y)",
    forward="torch.relu",
    script=None,
    args=None,
    env=None,
):
    """Runs the script in a fresh process; ``cache`` None leaves CSTORCH_GRAPH_CACHE unset
    (the default), with the user cache directory under ``tmp_path/home-cache``."""
    (tmp_path / "model_def.py").write_text(MODEL.replace("torch.relu", forward))
    (tmp_path / "train.py").write_text(script or TRAIN.format(expr=expr))
    env = dict(
        os.environ,
        **(env or {}),
        PYTHONPATH=os.pathsep.join(
            [str(tmp_path), REPO, os.path.join(REPO, "compat"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    if cache is None:
        env.pop("CSTORCH_GRAPH_CACHE", None)
        env["XDG_CACHE_HOME"] = str(tmp_path / "home-cache")
    else:
        env["CSTORCH_GRAPH_CACHE"] = str(cache)
    argv = args if args is not None else [str(width), str(batch), str(lr), precision, closure]
    out = fork_server.run(
        [sys.executable, "train.py", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(s for s in out.stdout.splitlines() if s.startswith("RESULT "))
    result = json.loads(line[7:])
    result["stderr"] = out.stderr
    return result


def _matches_eager(result, precision="fp32"):
    tolerance = 1e-6 if precision == "fp32" else 2e-2
    np.testing.assert_allclose(result["losses"], result["eager"], rtol=tolerance, atol=tolerance)
    assert [loss for _, loss in result["logged"]] == result["losses"]  # closures ran each step
    return True


@pytest.mark.heavy
def test_second_run_reuses_the_graph_and_every_change_captures_again(tmp_path):
    cache = tmp_path / "graphs"
    cold = _run(tmp_path, cache)
    assert cold["traces"] == 1 and cold["events"] == {"miss": 1, "store": 1}
    assert _matches_eager(cold)

    warm = _run(tmp_path, cache)
    assert warm["traces"] == 0 and warm["events"] == {"hit": 1}  # capture never ran
    assert warm["losses"] == cold["losses"]  # bitwise
    assert warm["logged"] == cold["logged"] and _matches_eager(warm)

    changes = {
        "the step function's source": dict(expr="objective(out, y) * 2.0"),
        "the model's width": dict(width=24),
        "the model's forward, in its own module": dict(forward="torch.tanh"),
        "an input shape": dict(batch=6),
        "a Python-number hyperparameter": dict(lr=0.05),
        "the precision": dict(precision="bf16"),
    }
    for what, change in changes.items():
        result = _run(tmp_path, cache, **change)
        assert result["traces"] == 1 and "hit" not in result["events"], what
        assert _matches_eager(result, change.get("precision", "fp32")), what


# A torch optimizer whose state is born in the first step, its floats read at every call,
# and a torch scheduler stepped in the step (run on the host after each call).
TRAIN_TORCH_OPTIMIZER = (
    PRELUDE
    + """
from model_def import Net

STEPS = 5

def losses_of(model, optimizer, scheduler, step, x, y):
    losses = []
    for i in range(STEPS):
        losses.append(float(step(x[i], y[i])))
    return losses, scheduler.get_last_lr()

def build(compiled):
    torch.manual_seed(0)
    model = Net(16)
    forward = cstorch.compile(model, cstorch.backend("CPU")) if compiled else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

    def training_step(x, y):
        loss = torch.nn.functional.cross_entropy(forward(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        return loss

    return model, optimizer, scheduler, cstorch.trace(training_step) if compiled else training_step

g = torch.Generator().manual_seed(1)
x, y = torch.randn(STEPS, 4, 8, generator=g), torch.randint(0, 3, (STEPS, 4), generator=g)
eager, eager_lr = losses_of(*build(False), x, y)
losses, lr = losses_of(*build(True), x, y)
report(losses=losses, logged=[], eager=eager, lr=lr, eager_lr=eager_lr)
"""
)


@pytest.mark.heavy
def test_a_torch_optimizer_step_with_a_scheduler_in_it_hits_and_trains_as_eager(tmp_path):
    """The cached graph keeps what the trace found: the optimizer floats it takes at every
    call, the scheduler step it runs after each call."""
    cache = tmp_path / "graphs"
    cold = _run(tmp_path, cache, script=TRAIN_TORCH_OPTIMIZER, args=[])
    # traces: the one that meets the torch optimizer (it stops, the optimizer is adopted),
    # the first step's program (the momentum buffers are born in it: never stored), the next
    assert cold["traces"] == 3 and cold["events"] == {"miss": 3, "store": 1}
    np.testing.assert_allclose(cold["losses"], cold["eager"], rtol=1e-6, atol=1e-6)
    assert cold["lr"] == cold["eager_lr"]
    warm = _run(tmp_path, cache, script=TRAIN_TORCH_OPTIMIZER, args=[])
    assert warm["traces"] == 2 and warm["events"] == {"miss": 2, "hit": 1}
    assert warm["losses"] == cold["losses"] and warm["lr"] == cold["eager_lr"]


@pytest.mark.heavy
def test_a_damaged_entry_is_captured_again_and_runs_nothing(tmp_path):
    """Each damage to the stored entry, one run after another: the run refuses or fails to
    use it, captures again (rewriting the entry), and gives the cold run's losses."""
    cache = tmp_path / "graphs"
    expr = "objective(out, y) * 2.0"
    cold = _run(tmp_path, cache, expr=expr)
    (entry,) = cache.glob("*.npz")

    # ``loss * 2.0`` made ``* 200.0``, re-zipped with its key field intact: the HMAC refuses it.
    def times_100(doc):
        node = next(
            n
            for n in doc["nodes"]
            if isinstance(n[1], str) and any(type(a) is float and a == 2.0 for a in n[2])
        )
        node[2] = [200.0 if type(a) is float and a == 2.0 else a for a in node[2]]

    rewrite_entry(entry, times_100)
    edited = _run(tmp_path, cache, expr=expr)
    assert edited["traces"] == 1 and edited["losses"] == cold["losses"]
    assert _matches_eager(edited) and "HMAC" in edited["stderr"]

    def inject(doc):
        node = first_node(doc, "aten::")
        node[1] = "builtins::eval.default"
        node[2] = ["__import__('os').system('touch PWNED')"]

    rewrite_entry(entry, inject, sign=True)  # past the HMAC: the decoder refuses it too
    tampered = _run(tmp_path, cache, expr=expr)
    assert tampered["traces"] == 1 and tampered["losses"] == cold["losses"]
    assert "GraphCacheWarning" in tampered["stderr"] and not (tmp_path / "PWNED").exists()

    # Well-formed but wrong: a matrix product made a subtraction. It decodes, fails to
    # lower, and the step is captured again instead of failing.
    rewrite_entry(
        entry,
        lambda doc: first_node(doc, "aten::mm.default").__setitem__(1, "aten::sub.Tensor"),
        sign=True,
    )
    swapped = _run(tmp_path, cache, expr=expr)
    assert swapped["traces"] == 1 and swapped["losses"] == cold["losses"]
    assert "failed" in swapped["stderr"] and "captured again" in swapped["stderr"]

    entry.write_bytes(entry.read_bytes()[:1000])  # the recapture rewrote it: truncate that
    truncated = _run(tmp_path, cache, expr=expr)
    assert truncated["traces"] == 1 and truncated["losses"] == cold["losses"]
    assert _run(tmp_path, cache, expr=expr)["traces"] == 0  # the rewritten entry serves again


@pytest.mark.heavy
def test_a_closure_the_cache_cannot_find_is_captured_every_time(tmp_path):
    cache = tmp_path / "graphs"
    for _ in range(2):
        result = _run(tmp_path, cache, closure="via dict")
        assert result["traces"] == 1 and "store" not in result["events"]
        assert _matches_eager(result)
    assert not list(cache.glob("*.npz"))


GIGAGPT = PRELUDE + textwrap.dedent("""
    import os, tempfile
    from model_def import Net

    def main():
        out_dir = tempfile.mkdtemp()
        backend = cstorch.backend("CPU", artifact_dir=out_dir)
        torch.manual_seed(0)
        with backend.device:
            model = Net(16)
        compiled_model = cstorch.compile(model, backend)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        optimizer = cstorch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
            lr=0.1, weight_decay=0.1, correct_bias=True, betas=(0.9, 0.95), eps=1e-8)
        lr_scheduler = cstorch.optim.lr_scheduler.SequentialLR(optimizer, schedulers=[
            cstorch.optim.lr_scheduler.LinearLR(optimizer, initial_learning_rate=0.0,
                                                end_learning_rate=3e-3, total_iters=2),
            cstorch.optim.lr_scheduler.CosineDecayLR(optimizer, initial_learning_rate=3e-3,
                                                     end_learning_rate=3e-4, total_iters=4)],
            milestones=[2])
        all_params = (p for group in optimizer.param_groups for p in group["params"])

        from cerebras.pytorch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(log_dir=os.path.join(out_dir, "train"))
        logged = []

        @cstorch.step_closure
        def log_loss(loss, step):
            logged.append(loss.item())
            writer.add_scalar("loss", loss.item(), step)

        @cstorch.checkpoint_closure
        def save_checkpoint(step):
            cstorch.save({"model": model.state_dict()}, os.path.join(out_dir, f"c{step}.mdl"))

        @cstorch.trace
        def training_step(batch):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(compiled_model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(all_params), 1.0)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            log_loss(loss, 0)
            return loss

        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g))
                for _ in range(4)]
        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(lambda: data), num_steps=4, checkpoint_steps=2)
        losses = []
        for step, batch in enumerate(executor, start=1):
            loss = training_step(batch)
            log_loss(loss, step)
            save_checkpoint(step)
            losses.append(loss.item())
        writer.close()
        torch.manual_seed(0)
        with backend.device:  # initialised as the compiled model was
            reference = Net(16)
        with torch.no_grad():
            eager = torch.nn.functional.cross_entropy(reference(data[0][0]), data[0][1]).item()
        report(losses=losses, logged=logged, eager=eager,
               checkpoints=sorted(f for f in os.listdir(out_dir) if f.endswith(".mdl")))

    main()
""")


def test_a_gigagpt_style_script_hits(tmp_path):
    """gigaGPT's layout: closures defined in main(), one called inside the traced step, a
    generator of parameters the step consumes, AdamW groups, a scheduler, gradient clipping."""
    cache = tmp_path / "graphs"
    cold = _run(tmp_path, cache, script=GIGAGPT, args=[])
    warm = _run(tmp_path, cache, script=GIGAGPT, args=[])
    assert cold["traces"] == 1 and warm["traces"] == 0 and warm["events"] == {"hit": 1}
    assert warm["losses"] == cold["losses"] and warm["logged"] == cold["logged"]
    assert len(warm["logged"]) == 8  # inside and outside the step, every step
    assert warm["losses"][0] == pytest.approx(cold["eager"], rel=1e-6)
    assert warm["checkpoints"] == ["c2.mdl", "c4.mdl"]


@pytest.mark.heavy
def test_the_cache_is_off_by_default(tmp_path):
    for _ in range(2):
        result = _run(tmp_path, None)
        assert result["traces"] == 1 and result["events"] == {}
        assert _matches_eager(result)
    assert not (tmp_path / "home-cache" / "cstorch-jax" / "graphs").exists()


# Everything the step reads besides its objects: an environment variable, the command line,
# a file opened while it is traced, a user module's attribute read with getattr (set from a
# file read before the step, which the trace never sees), a cstorch flag read by cstorch
# code (cstorch.current_pol), torch.nn.functional.gelu replaced by user code (called by
# nn.GELU inside torch), and which gradient hook is on a parameter (registered outside the
# step; a parameter is state, which the fingerprint names by its place only).
DEPENDENCIES = PRELUDE + textwrap.dedent("""
    import json, os
    import settings

    with open("config.json") as f:
        config = json.load(f)
    settings.scale = config["scale"]
    cstorch.backends.csx.precision.optimization_level = config["pol"]
    if config["patch_gelu"]:
        torch.nn.functional.gelu = lambda x, approximate="none": x * 0.5

    GRAD_HOOKS = {"keep": lambda grad: grad, "halve": lambda grad: grad * 0.5}

    def hook_parameters(net):  # one hook either way: the same handle ids follow it
        net.fc.weight.register_hook(GRAD_HOOKS[config["grad_hook"]])

    STEPS = 2

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 3)
            self.act = torch.nn.GELU()

        def forward(self, x):
            return self.act(self.fc(x))

    def factor():
        with open("weight.txt") as f:
            from_file = float(f.read())
        return (float(os.environ["STEP_SCALE"]) * float(sys.argv[1]) * from_file
                * getattr(settings, "scale") * (1 + cstorch.current_pol()))

    def main():
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
        torch.manual_seed(0)
        reference = Net()
        hook_parameters(reference)
        sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
        eager = []
        for _ in range(STEPS):
            loss = torch.nn.functional.cross_entropy(reference(x), y) * factor()
            sgd.zero_grad()
            loss.backward()
            sgd.step()
            eager.append(loss.item())

        backend = cstorch.backend("CPU")
        torch.manual_seed(0)
        model = Net()
        compiled = cstorch.compile(model, backend)
        hook_parameters(model)
        optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

        @cstorch.trace
        def training_step(x, y):
            loss = torch.nn.functional.cross_entropy(compiled(x), y) * factor()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss

        loader = cstorch.utils.data.DataLoader(lambda: [(x, y)] * STEPS)
        losses = [training_step(bx, by).item()
                  for bx, by in cstorch.utils.data.DataExecutor(loader, num_steps=STEPS)]
        report(losses=losses, eager=eager)

    main()
""")

BASE = {
    "env": "1.0",
    "argv": "1.0",
    "file": "1.0",
    "scale": 1.0,
    "pol": 1,
    "patch_gelu": False,
    "grad_hook": "keep",
}


def _run_dependencies(tmp_path, cache, **changes):
    values = dict(BASE, **changes)
    (tmp_path / "settings.py").write_text("scale = 1.0\n")
    (tmp_path / "weight.txt").write_text(values["file"])
    (tmp_path / "config.json").write_text(
        json.dumps({k: values[k] for k in ("scale", "pol", "patch_gelu", "grad_hook")})
    )
    result = _run(
        tmp_path,
        cache,
        script=DEPENDENCIES,
        args=[values["argv"]],
        env={"STEP_SCALE": values["env"], "CSTORCH_GRAPH_CACHE_EXPLAIN": "1"},
    )
    np.testing.assert_allclose(result["losses"], result["eager"], rtol=1e-6, atol=1e-6)
    return _with_misses(result)


def _with_misses(result):
    """``result`` with ``misses``: the reasons of the graph cache's miss lines on stderr."""
    result["misses"] = [
        line.split(": ", 1)[1]
        for line in result["stderr"].splitlines()
        if line.startswith("graph cache miss ")
    ]
    return result


@pytest.mark.heavy
def test_every_value_the_step_reads_from_outside_its_objects_is_in_the_key(tmp_path):
    """The stale-cache runs: with the cache on, change one value the step reads and run
    again in a new process; each run captures again, matches eager torch, and its miss
    (CSTORCH_GRAPH_CACHE_EXPLAIN) names the part of the key the change is in, so no run
    misses for another reason than the one it tests."""
    cache = tmp_path / "graphs"
    cold = _run_dependencies(tmp_path, cache)
    assert cold["traces"] == 1 and cold["events"] == {"miss": 1, "store": 1}
    assert cold["misses"] == ["no entry of this step is stored"]
    warm = _run_dependencies(tmp_path, cache)
    assert warm["traces"] == 0 and warm["events"] == {"hit": 1} and warm["misses"] == []
    assert warm["losses"] == cold["losses"]
    # First the changes whose run would find the cold run's entry if the key missed them (a
    # changed file read by the trace is a miss by the entry's file list, and its run's entry
    # replaces the cold one under the same key). The parts a miss names: the value itself,
    # and the function that reads it where that function's fingerprint holds what it read.
    for change, parts in (
        ({"grad_hook": "halve"}, "parameter hooks"),
        ({"env": "2.0"}, "step function's global factor, environment variable STEP_SCALE"),
        ({"argv": "3.0"}, "step function's global factor, command line"),
        ({"file": "0.5"}, None),
        ({"scale": 4.0}, "step function's global factor"),
        ({"pol": 2}, "cstorch.backends"),
        ({"patch_gelu": True}, "library attributes replaced by user code"),
    ):
        result = _run_dependencies(tmp_path, cache, **change)
        assert result["traces"] == 1 and "hit" not in result["events"], change
        assert result["losses"] != cold["losses"], change  # the change matters
        (miss,) = result["misses"]
        if parts is None:
            assert miss == f"{tmp_path / 'weight.txt'} changed", miss
        else:
            assert miss.endswith(f" part{'s' if ',' in parts else ''}: {parts}"), miss


def test_variables_the_libraries_set_during_a_first_trace_leave_the_key_alone(monkeypatch):
    """torch 2.9 sets TORCHINDUCTOR_CACHE_DIR, and JAX 0.7 TF_CPP_MIN_LOG_LEVEL and
    TPU_SKIP_MDS_QUERY, while a first step is traced: the key taken after the trace must equal
    the one taken before, or no step is ever stored on those releases (the compat leg). A
    variable a user sets still counts."""
    from jax_backend import graph_cache

    for name in (
        "TORCHINDUCTOR_CACHE_DIR",
        "TF_CPP_MIN_LOG_LEVEL",
        "TPU_SKIP_MDS_QUERY",
        "CSTORCH_TEST_USER_SETTING",
    ):
        monkeypatch.delenv(name, raising=False)
    before = graph_cache.process_inputs()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_someone")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    assert graph_cache.process_inputs() == before
    monkeypatch.setenv("CSTORCH_TEST_USER_SETTING", "1")
    assert graph_cache.process_inputs() != before


def test_os_environ_read_by_a_step_leaves_out_what_the_libraries_set(monkeypatch):
    """A step that reads ``os.environ[...]`` has the environment in its fingerprint: the
    variables torch and JAX set during a first trace are left out there too; a user's count."""
    from jax_backend.graph_cache import fingerprint

    def digest():
        f = fingerprint.Fingerprinter()
        f.add("step", {"environ": os.environ})
        return f.hexdigest()

    for name in (
        "TORCHINDUCTOR_CACHE_DIR",
        "TF_CPP_MIN_LOG_LEVEL",
        "TPU_SKIP_MDS_QUERY",
        "CSTORCH_TEST_USER_SETTING",
    ):
        monkeypatch.delenv(name, raising=False)
    before = digest()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_someone")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    assert digest() == before
    monkeypatch.setenv("CSTORCH_TEST_USER_SETTING", "1")
    assert digest() != before


# A miss says which part of the key changed. The step reads a user module's attribute (set
# from a file before the step), updates a metric (whose step closure a hit must restore) and
# is otherwise the quickstart's; each run changes one thing.
EXPLAINED = PRELUDE + textwrap.dedent("""
    import settings

    STEPS = 2

    def main():
        with open("scale.txt") as f:
            settings.scale = float(f.read())
        backend = cstorch.backend("CPU")
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 3)
        compiled = cstorch.compile(model, backend)
        optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
        mean_loss = cstorch.metrics.MeanMetric("mean_loss")

        @cstorch.trace
        def training_step(x, y):
            loss = torch.nn.functional.cross_entropy(compiled(x), y) * settings.scale{edit}
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mean_loss(loss)
            return loss

        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
        loader = cstorch.utils.data.DataLoader(lambda: [(x, y)] * STEPS)
        losses = [training_step(bx, by).item()
                  for bx, by in cstorch.utils.data.DataExecutor(loader, num_steps=STEPS)]
        report(losses=losses, mean=float(mean_loss.compute()), updates=mean_loss.num_updates)

    main()
""")


def _explained(tmp_path, cache, *, scale="1.0", variable="1", edit="", explain="1"):
    (tmp_path / "settings.py").write_text("scale = 1.0\n")
    (tmp_path / "scale.txt").write_text(scale)
    result = _run(
        tmp_path,
        cache,
        script=EXPLAINED.replace("{edit}", edit),
        args=[],
        env={"CSTORCH_TEST_UNREAD": variable, "CSTORCH_GRAPH_CACHE_EXPLAIN": explain},
    )
    return _with_misses(result)


@pytest.mark.heavy
def test_a_miss_says_which_part_of_the_key_changed(tmp_path):
    """With CSTORCH_GRAPH_CACHE_EXPLAIN=1 each miss is a line on stderr naming the parts of
    the key that differ from the step's stored entries: change one thing between two runs,
    and the line names that part and only that. Off (the default), nothing is printed."""
    cache = tmp_path / "graphs"
    cold = _explained(tmp_path, cache, explain="0")
    assert cold["traces"] == 1 and cold["events"] == {"miss": 1, "store": 1}
    assert cold["misses"] == [] and "graph cache" not in cold["stderr"]
    warm = _explained(tmp_path, cache)
    assert warm["traces"] == 0 and warm["events"] == {"hit": 1} and warm["misses"] == []
    # the metric's step closure, stored by its public name, counted every step of the hit
    assert warm["losses"] == cold["losses"] and warm["updates"] == 2
    assert warm["mean"] == cold["mean"] == pytest.approx(sum(cold["losses"]) / 2)

    changes = {
        "environment variable CSTORCH_TEST_UNREAD": dict(variable="2"),
        "step function's global settings": dict(scale="2.0"),  # settings.scale
        "step function": dict(edit=" + 0.0"),  # the step's code
    }
    prefix = "its key differs from the step's nearest of "
    for entries, (part, change) in enumerate(changes.items(), start=1):
        result = _explained(tmp_path, cache, **change)
        assert result["traces"] == 1 and "hit" not in result["events"], part
        (miss,) = result["misses"]
        assert miss.startswith(
            prefix if entries > 1 else "its key differs from the step's stored entry"
        ) and miss.endswith(f" in 1 part: {part}"), miss
