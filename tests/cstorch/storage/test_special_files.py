"""Every reader refuses a FIFO, a directory or a character device where it expects a file,
with a clear error, in bounded time, before reading from it.

A FIFO opened for reading blocks until a writer comes (forever, if none does) and
``/dev/zero`` never ends. The readers: ``cstorch.load`` and the H5 and safetensors readers
under it, the exported-step loader (``jax_backend.exported`` and the standalone
``exported_step.py`` an artifact carries), graph-cache entries, the Trainer's autoload of
the newest checkpoint, TensorBoard event files, and the clean-up of a dead save's temporary
files. All run in one subprocess with a time limit; inside it each reader gets its own
``SIGALRM`` deadline, so a reader that blocks is named instead of hanging the test.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from tests import fork_server
from tests.paths import REPO

pytestmark = pytest.mark.slow  # every test reads the results of one subprocess (module fixture)

KINDS = ("fifo", "directory", "device", "socket")
WORDS = {"fifo": "FIFO", "directory": "directory", "device": "device", "socket": "socket"}

PROBE = textwrap.dedent("""
    import importlib.util, json, os, resource, shutil, signal, socket, stat, sys, time, warnings
    # A reader that reads /dev/zero to its end must fail here, not exhaust the machine.
    resource.setrlimit(resource.RLIMIT_DATA, (4 << 30, 4 << 30))
    import torch
    import cerebras.pytorch as cstorch
    from cstorch.storage import h5_format, safetensors_format
    from cstorch.utils.tensorboard import event_file
    from jax_backend import exported, graph_cache

    tmp = sys.argv[1]
    results = {}

    class Hung(Exception):
        pass

    def on_alarm(*_):
        raise Hung()

    signal.signal(signal.SIGALRM, on_alarm)

    sockets = []  # (kept open while the probes run)

    def special(kind, path):
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "socket":  # opening one fails with ENXIO (issue 31, item 9)
            sock = socket.socket(socket.AF_UNIX)
            here = os.getcwd()
            os.chdir(os.path.dirname(path))  # (a relative name: AF_UNIX paths are short)
            try:
                sock.bind(os.path.basename(path))
            finally:
                os.chdir(here)
            sockets.append(sock)
        elif kind == "directory":
            os.mkdir(path)
        elif os.geteuid() == 0:  # a character device node: /dev/zero's numbers
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))
        else:
            os.symlink("/dev/zero", path)
        return path

    def probe(name, fn):
        signal.alarm(30)
        start = time.monotonic()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = fn()
            results[name] = {"returned": repr(value)[:200],
                             "warnings": [str(w.message)[:300] for w in caught]}
        except Hung:
            results[name] = {"hung": True}
        except BaseException as e:
            results[name] = {"error": type(e).__name__, "message": str(e)[:300]}
        finally:
            signal.alarm(0)
        results[name]["seconds"] = time.monotonic() - start

    # An exported step to take apart.
    cstorch.backend("CPU")
    model = torch.nn.Linear(4, 2)
    compiled = cstorch.compile(model)

    @cstorch.trace
    def step(x):
        return compiled(x).square().mean()

    x = torch.ones(3, 4)
    step(x)
    artifact = cstorch.export(step, x, os.path.join(tmp, "artifact"))
    spec = importlib.util.spec_from_file_location(
        "exported_step", os.path.join(artifact, "exported_step.py"))
    standalone = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standalone)

    from tests.trainer.common import ClassifierMLP, torch_loader
    from cerebras.modelzoo.trainer import Trainer
    from cerebras.modelzoo.trainer.callbacks import TrainingLoop

    for kind in ("fifo", "directory", "device", "socket"):
        d = os.path.join(tmp, kind)
        os.mkdir(d)
        path = special(kind, os.path.join(d, "checkpoint.mdl"))
        probe(f"cstorch.load/{kind}", lambda: cstorch.load(path))
        probe(f"H5Reader/{kind}", lambda: h5_format.H5Reader(path))
        probe(f"safetensors/{kind}", lambda: safetensors_format.read(path))
        probe(f"event file/{kind}", lambda: list(event_file.read_records(path)))
        for member in ("manifest.json", "step.jaxexport", "state.npz"):
            copy = os.path.join(d, "artifact-" + member)
            shutil.copytree(artifact, copy)
            os.unlink(os.path.join(copy, member))
            special(kind, os.path.join(copy, member))
            probe(f"exported {member}/{kind}", lambda: exported.load(copy))
            probe(f"exported_step.py {member}/{kind}", lambda: standalone.load(copy))

        cache = os.path.join(d, "graphs")
        os.mkdir(cache, 0o700)
        key = "ab" * 32
        special(kind, os.path.join(cache, key + ".npz"))
        probe(f"graph cache entry/{kind}", lambda: graph_cache.load(cache, key, [], []))

        stray = special(kind, os.path.join(d, "saved.mdl.0123abcd.tmp"))
        os.utime(stray, (time.time() - 3600,) * 2, follow_symlinks=False)
        probe(f"stray temp file/{kind}",
              lambda: h5_format.remove_stray_temp_files(os.path.join(d, "saved.mdl")))

        model_dir = os.path.join(d, "trainer")
        os.mkdir(model_dir)
        special(kind, os.path.join(model_dir, "checkpoint_5.mdl"))
        trainer = Trainer(device="CPU", model_dir=model_dir, model=ClassifierMLP,
                          optimizer=lambda m: cstorch.optim.SGD(m.parameters(), lr=0.1),
                          loop=TrainingLoop(num_steps=1))
        probe(f"Trainer autoload/{kind}",
              lambda: trainer.fit(cstorch.utils.data.DataLoader(torch_loader, 1)))

    print("RESULT " + json.dumps(results))
""")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("special")
    script = tmp / "probe.py"
    script.write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "compat")]))
    (tmp / "work").mkdir()
    out = fork_server.run(
        [sys.executable, str(script), str(tmp / "work")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=tmp,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(s for s in out.stdout.splitlines() if s.startswith("RESULT "))
    return json.loads(line[7:])


def _expect_refusal(result, kind, words=None):
    assert not result.get("hung"), "blocked"
    assert result["seconds"] < 10, result
    text = result.get("message") or " ".join(result.get("warnings", []))
    words = words or [WORDS[kind]]
    if kind == "device" and os.geteuid() != 0:
        words = words + ["symbolic link"]  # /dev/zero through a link where mknod needs root
    assert any(w in text for w in words), result


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "reader", ["cstorch.load", "H5Reader", "safetensors", "event file", "Trainer autoload"]
)
def test_checkpoint_readers_refuse_special_files(results, reader, kind):
    result = results[f"{reader}/{kind}"]
    _expect_refusal(result, kind)
    expected = (
        "IsADirectoryError"
        if reader == "cstorch.load" and kind == "directory"
        else "NotARegularFileError"
    )
    assert result["error"] == expected, result


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("member", ["manifest.json", "step.jaxexport", "state.npz"])
@pytest.mark.parametrize("loader", ["exported", "exported_step.py"])
def test_exported_step_loaders_refuse_special_files(results, loader, member, kind):
    result = results[f"{loader} {member}/{kind}"]
    _expect_refusal(result, kind)
    assert result["error"] == "ExportError" and member in result["message"], result


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_graph_cache_entry_is_a_miss_with_a_warning(results, kind):
    result = results[f"graph cache entry/{kind}"]
    _expect_refusal(result, kind, [WORDS[kind], "symbolic link"])
    assert result["returned"] == "None" and len(result["warnings"]) == 1, result


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_file_named_like_a_dead_save_is_left_alone(results, kind):
    result = results[f"stray temp file/{kind}"]
    assert not result.get("hung") and result["seconds"] < 10, result
    assert result["returned"] == "[]", result
