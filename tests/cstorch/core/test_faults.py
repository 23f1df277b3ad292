"""Faults must never lose or corrupt training state.

Fault classes: interrupts (Ctrl-C during a step), execution errors (a step that fails while
it runs), torch-side edits between steps, disk full during a save, untrusted checkpoint
files and concurrent saves. Each test compares against an independent reference: the same
training run without the fault, or the same edit made through ``load_state_dict``.
"""

from __future__ import annotations

import _thread
import copy
import gc
import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from jax_backend import Program
from jax_backend.errors import StepFailedError
from tests import fork_server
from tests.lanes import marked_cases

pytestmark = pytest.mark.core

XS = [torch.randn(8, 4, generator=torch.Generator().manual_seed(i)) for i in range(8)]


def _run(edit=None, steps_before=3, steps_after=3, batch=None):
    """A fresh backend, model and AdamW; ``steps_before`` steps, ``edit(model, optimizer)``,
    then ``steps_after`` steps. Returns (model state, optimizer state, losses)."""
    cstorch.backend._reset_for_tests()
    backend = cstorch.backend("CPU")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=0.05)

    @cstorch.trace
    def step(x):
        loss = compiled(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    losses = [step(x) for x in XS[:steps_before]]
    if edit is not None:
        edit(model, optimizer, step)
    losses += [step(x) for x in XS[steps_before : steps_before + steps_after]]
    return (
        copy.deepcopy(model.state_dict()),
        copy.deepcopy(optimizer.state_dict()),
        [float(loss) for loss in losses],
    )


def _assert_same(run_a, run_b):
    for key in run_a[0]:
        torch.testing.assert_close(run_a[0][key], run_b[0][key], rtol=0, atol=0)
    assert run_a[2] == run_b[2]


# ------------------------------------------------------------------ in-place edits
def _through_load_state_dict(change):
    """The reference path for an edit: state_dict -> change -> load_state_dict."""

    def edit(model, optimizer, step):
        state = model.state_dict()
        change(state)
        model.load_state_dict(state)

    return edit


@pytest.mark.parametrize(
    "name",
    marked_cases(
        EDITS := ["noop_add", "clamp", "data_mul", "data_assign"], ids=EDITS, slow={"noop_add"}
    ),
)
def test_in_place_edits_between_steps_apply_to_the_newest_value(name):
    clip = 0.05

    def direct(model, optimizer, step):
        with torch.no_grad():
            if name == "noop_add":
                model.weight.add_(0.0)
            elif name == "clamp":
                model.weight.clamp_(-clip, clip)
            elif name == "data_mul":
                model.weight.data.mul_(0)
            else:
                model.weight.data = torch.full((3, 4), 0.25)

    def reference(state):
        if name == "clamp":
            state["weight"].clamp_(-clip, clip)
        elif name == "data_mul":
            state["weight"].mul_(0)
        elif name == "data_assign":
            state["weight"].fill_(0.25)

    _assert_same(_run(direct), _run(_through_load_state_dict(reference)))


def test_reading_a_parameter_between_steps_shows_the_newest_value():
    def read(model, optimizer, step):
        newest = model.weight.detach().clone()  # a torch read between steps
        assert torch.equal(newest, model.state_dict()["weight"])

    _assert_same(_run(read), _run())


# ------------------------------------------------------------------ interrupts
@pytest.fixture(autouse=True)
def _ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt in these tests, as in an interactive Python: a test
    process started in the background by a shell without job control inherits SIGINT ignored
    (which the engine then honours)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_as_the_call_returns(monkeypatch, how):
    real = Program.__call__
    calls = []

    def call(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            if how == "signal":
                signal.raise_signal(signal.SIGINT)
            elif how == "garbled":  # as C code reports an interrupt in a callback it made
                try:
                    raise KeyboardInterrupt
                except KeyboardInterrupt as interrupt:
                    raise SystemError(
                        "<function f> returned a result with an exception set"
                    ) from interrupt
            else:
                raise KeyboardInterrupt
        return out

    monkeypatch.setattr(Program, "__call__", call)


def test_sigint_landing_as_the_step_returns_keeps_a_consistent_state(monkeypatch):
    """The interrupt is delivered once the step's new state is recorded: the step counts."""
    reference = _run(steps_before=4, steps_after=0)

    def interrupted(model, optimizer, step):
        _interrupt_as_the_call_returns(monkeypatch, "signal")
        with pytest.raises(KeyboardInterrupt):
            step(XS[3])
        monkeypatch.undo()

    state, _, _ = _run(interrupted, steps_before=3, steps_after=0)
    for key in state:
        torch.testing.assert_close(state[key], reference[0][key], rtol=0, atol=0)


def test_keyboard_interrupt_raised_inside_dispatch_leaves_readable_state(monkeypatch):
    """A KeyboardInterrupt raised (not signalled) after the state was donated: the state is
    never left pointing at deleted arrays; the consumed tensors fall back to their last
    synchronised values and training goes on."""

    def interrupted(model, optimizer, step):
        model.state_dict()  # synchronise: the fallback values are those of step 3
        after_three = copy.deepcopy(model.state_dict())
        _interrupt_as_the_call_returns(monkeypatch, "raise")
        with pytest.raises(KeyboardInterrupt):
            step(XS[3])
        monkeypatch.undo()
        state = model.state_dict()  # no "Array has been deleted"
        for key in state:
            torch.testing.assert_close(state[key], after_three[key], rtol=0, atol=0)
        optimizer.state_dict()

    _run(interrupted, steps_before=3, steps_after=2)


def test_an_interrupt_garbled_into_a_system_error_by_c_code_reaches_the_user(monkeypatch):
    """A Ctrl-C landing in Python code that C code called (JAX's dtype property read by numpy,
    a callback) surfaces as a SystemError; the step gives the user the KeyboardInterrupt,
    with the state as for a plain interrupt."""

    def interrupted(model, optimizer, step):
        model.state_dict()
        after_three = copy.deepcopy(model.state_dict())
        _interrupt_as_the_call_returns(monkeypatch, "garbled")
        with pytest.raises(KeyboardInterrupt):
            step(XS[3])
        monkeypatch.undo()
        state = model.state_dict()
        for key in state:
            torch.testing.assert_close(state[key], after_three[key], rtol=0, atol=0)

    _run(interrupted, steps_before=3, steps_after=2)


def _interrupted_at_call(step, x, k) -> tuple:
    """``step(x)`` with Ctrl-C arriving at the ``k``-th Python function call inside it (as
    the signal does: the main thread's handler runs at its next check). Returns what the
    caller saw: "interrupt" (its handler ran), "unraisable" (Python itself dropped it, in a
    finalizer: eager torch too), "none" (the step had fewer calls) or the error's repr; and
    the number of calls made."""
    calls, dropped = [0], []

    def tracer(frame, event, arg):
        calls[0] += 1
        if calls[0] == k:
            _thread.interrupt_main()

    previous_trace, previous_hook = sys.gettrace(), sys.unraisablehook
    sys.unraisablehook = lambda info: dropped.append(info.exc_type)
    try:
        sys.settrace(tracer)
        step(x)
        sys.settrace(previous_trace)
        outcome = "none"
    except KeyboardInterrupt:
        outcome = "interrupt"
    except Exception as error:  # noqa: BLE001 - the outcome under test
        outcome = repr(error)[:300]
    finally:
        sys.settrace(previous_trace)
        sys.unraisablehook = previous_hook
    if outcome == "none" and KeyboardInterrupt in dropped:
        outcome = "unraisable"
    if jax.config.jax_enable_x64:  # an engine scope's exit cut short: the user's JAX changed
        outcome = "x64 left on"
    if not torch.is_grad_enabled():  # a torch.no_grad() exit of the engine's cut short
        torch.set_grad_enabled(True)
        outcome = "grad mode left off"
    return outcome, calls[0]


def _interrupted_at_every_call(call, argument, before_each) -> dict:
    """``{k: outcome}`` of ``_interrupted_at_call`` for every call index ``k`` that
    ``call(argument)`` makes, ``before_each()`` run before each (and before the count)."""
    outcomes = {}
    gc.disable()  # no finalizer runs inside the call: each call index is the same point
    try:
        before_each()
        _, calls = _interrupted_at_call(call, argument, 0)  # how many calls it makes
        for k in range(1, calls + 1):
            before_each()
            outcomes[k] = _interrupted_at_call(call, argument, k)[0]
    finally:
        gc.enable()
    return outcomes


@pytest.mark.slow  # (about 5 s of CPU: hundreds of traced steps and two compilations)
def test_ctrl_c_at_every_call_of_a_step_reaches_the_handler_and_the_state_stays_whole():
    """Ctrl-C at each Python call of a step that uploads state (issue 49, item 7): the
    user's ``except KeyboardInterrupt`` always runs (it used to get a SystemError from
    numpy's dtype conversion in the upload, or nothing at all), and the state is that of a
    run without interrupts with as many steps as the interrupted ones counted."""
    outcomes = {}

    def interrupt_everywhere(model, optimizer, step):
        def edit():
            with torch.no_grad():
                model.weight.add_(0.0)  # edited on the torch side: uploaded by the step

        outcomes.update(_interrupted_at_every_call(step, XS[3], before_each=edit))

    state, optimizer_state, _ = _run(interrupt_everywhere, steps_after=1)
    assert len(outcomes) > 100  # (a step makes hundreds of calls: the sweep did run)
    wrong = {k: v for k, v in outcomes.items() if v not in ("interrupt", "unraisable")}
    assert not wrong, f"Ctrl-C did not reach the handler at calls {wrong}"
    powers = {float(s["beta1_power"]) for s in optimizer_state["state"].values()}
    assert len(powers) == 1  # every parameter's state went through the same steps
    steps = round(math.log(powers.pop()) / math.log(0.9)) - 1
    counted = steps - 3 - 1  # in the sweep: all but the 3 steps before and the one after

    def clean(model, optimizer, step):
        for _ in range(counted):
            step(XS[3])

    reference = _run(clean, steps_after=1)
    for key in state:
        torch.testing.assert_close(state[key], reference[0][key], rtol=0, atol=0)


@pytest.mark.slow  # (a few seconds of CPU: hundreds of state reads and steps)
def test_ctrl_c_at_every_call_of_a_state_read_leaves_the_users_settings_as_they_were():
    """Ctrl-C at each Python call of ``state_dict()`` after a step, which fetches the
    released state from the device in engine scopes and writes it into torch tensors under
    ``torch.no_grad()``: the thread's JAX 64-bit mode and torch grad mode stay as the user had
    them (an interrupt landing in ``no_grad``'s exit used to leave grad mode off, and the next
    step recompiled for it), and the state torch then reads is the steps'."""
    outcomes = {}

    def interrupt_everywhere(model, optimizer, step):
        def read(_):
            return {key: value.clone() for key, value in model.state_dict().items()}

        # before each read, a step: the state is on the device again
        outcomes.update(_interrupted_at_every_call(read, None, before_each=lambda: step(XS[3])))

    state, _, _ = _run(interrupt_everywhere, steps_after=0)
    assert len(outcomes) > 100  # (a read makes hundreds of calls: the sweep did run)
    # "none": the read made fewer calls than the first one (nothing left to fetch), so the
    # interrupt never came
    wrong = {k: v for k, v in outcomes.items() if v not in ("interrupt", "unraisable", "none")}
    assert not wrong, f"Ctrl-C at these calls of a state read: {wrong}"

    def clean(model, optimizer, step):
        for _ in range(len(outcomes) + 1):
            step(XS[3])

    reference = _run(clean, steps_after=0)
    for key in state:
        torch.testing.assert_close(state[key], reference[0][key], rtol=0, atol=0)


def test_an_interrupt_reported_as_a_system_error_in_the_upload_is_a_keyboard_interrupt(monkeypatch):
    """C code that called Python when Ctrl-C landed reports a SystemError with the interrupt
    as its cause; the upload re-raises the interrupt, and the state is as before the step."""
    import jax_backend.state

    def interrupted(model, optimizer, step):
        def c_code_reporting(*args, **kwargs):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as interrupt:
                raise SystemError(
                    "<function f> returned a result with an exception set"
                ) from interrupt

        with torch.no_grad():
            model.weight.add_(0.0)  # uploaded by the next step
        for name in ("tensor_to_array", "state_to_host"):
            monkeypatch.setattr(jax_backend.state, name, c_code_reporting)
        with pytest.raises(KeyboardInterrupt):
            step(XS[3])
        monkeypatch.undo()

    _assert_same(_run(interrupted), _run())


# ------------------------------------------------------------------ execution errors
def _fail_first_run_with_batch(monkeypatch, batch):
    real = Program.__call__

    def call(self, used, inputs, seed=0):
        out = real(self, used, inputs, seed)
        if inputs[0].shape[0] == batch:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 17179869184 bytes")
        return out

    monkeypatch.setattr(Program, "__call__", call)


@pytest.mark.slow
def test_failed_step_keeps_the_last_good_state_and_training_continues(monkeypatch):
    """One oversized batch fails while it runs (after its state was donated): the state of
    the last good step stays readable and usable, and later steps match a run without it."""

    def oversized(model, optimizer, step):
        _fail_first_run_with_batch(monkeypatch, 64)
        with pytest.raises(StepFailedError, match="RESOURCE_EXHAUSTED.*restored"):
            step(torch.randn(64, 4))
        monkeypatch.undo()
        model.state_dict()
        optimizer.state_dict()

    with pytest.warns(cstorch.core.compile.RecompilationWarning):
        failed_run = _run(oversized)
    _assert_same(failed_run, _run())


def test_failing_steady_state_step_rolls_back_with_a_clear_error(monkeypatch):
    real = Program.__call__
    state = {"n": 0}

    def call(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        state["n"] += 1
        if state["n"] == 1:
            raise RuntimeError("INTERNAL: device halted")
        return out

    def failing(model, optimizer, step):
        synced = copy.deepcopy(model.state_dict())
        monkeypatch.setattr(Program, "__call__", call)
        with pytest.raises(StepFailedError, match="rolled back to their last synchronised"):
            step(XS[3])
        monkeypatch.undo()
        now = model.state_dict()
        for key in now:
            torch.testing.assert_close(now[key], synced[key], rtol=0, atol=0)

    _run(failing, steps_after=2)


def test_a_failure_before_donation_changes_nothing(monkeypatch):
    def call(self, *args, **kwargs):
        raise RuntimeError("INVALID_ARGUMENT: refused before running")

    def failing(model, optimizer, step):
        monkeypatch.setattr(Program, "__call__", call)
        with pytest.raises(RuntimeError, match="INVALID_ARGUMENT: refused before running"):
            step(XS[3])
        monkeypatch.undo()

    _assert_same(_run(failing), _run())


_STRESS = textwrap.dedent("""
    import os, random, signal, sys, threading
    import torch
    import cerebras.pytorch as cstorch

    signal.signal(signal.SIGINT, signal.default_int_handler)  # not inherited ignored
    out, rounds = sys.argv[1], int(sys.argv[2])
    backend = cstorch.backend("CPU", artifact_dir=out)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3)

    @cstorch.trace
    def step(x):
        loss = compiled(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    x = torch.randn(4, 16)
    step(x).item()  # compile before the interrupts start
    caught, saved = threading.Event(), threading.Event()
    running, stop = threading.Event(), threading.Event()
    rng = random.Random(0)

    def interrupter():
        for _ in range(rounds):
            running.wait()  # Ctrl-C only inside the try: not while a handler finishes
            stop.wait(rng.uniform(0.0, 0.02))
            caught.clear()
            saved.clear()
            os.kill(os.getpid(), signal.SIGINT)
            # Python drops a KeyboardInterrupt that lands in a finalizer or weakref callback
            # ("Exception ignored in ..."), in eager torch too; press Ctrl-C again, as a user would.
            while not caught.wait(5.0):
                os.kill(os.getpid(), signal.SIGINT)
            saved.wait()

    threading.Thread(target=interrupter, daemon=True).start()
    steps = 0
    for i in range(rounds):
        try:
            step(x)
            steps += 1
            running.set()  # after a step of this round: each round's count is one more at least
            while True:
                loss = step(x)
                steps += 1
                if steps % 16 == 0:
                    loss.item()
        except KeyboardInterrupt:
            running.clear()
            caught.set()
            path = os.path.join(out, f"interrupt_{i}.mdl")
            cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "steps": steps}, path)
            saved.set()
    print("steps", steps)
""")


@pytest.mark.slow
def test_stress_interrupts_then_save_in_the_except_handler(tmp_path):
    """Ctrl-C at random moments of a fast training loop, 32 times; every time the except
    handler saves model and optimizer, and every checkpoint is complete and consistent."""
    rounds = 32
    result = fork_server.run(
        [sys.executable, "-c", _STRESS, str(tmp_path), str(rounds)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    previous = None
    for i in range(rounds):
        state = cstorch.load(str(tmp_path / f"interrupt_{i}.mdl"))
        params = [state["model"][k] for k in ("0.weight", "0.bias", "2.weight", "2.bias")]
        assert all(torch.isfinite(torch.as_tensor(p)).all() for p in params)
        # Every parameter's optimizer state went through the same number of updates.
        beta1 = {float(s["beta1_power"]) for s in state["optimizer"]["state"].values()}
        assert len(beta1) == 1, f"inconsistent optimizer state after interrupt {i}: {beta1}"
        count = int(state["steps"])  # steps run before this interrupt
        assert count >= i + 1
        if previous is not None:
            assert count > previous
        previous = count


# ------------------------------------------------------------------ untrusted files
from cstorch.storage.h5_format import UntrustedCheckpointError  # noqa: E402
from cstorch.storage.treespec import TreeSpecError  # noqa: E402


def _checkpoint(tmp_path, name="ckpt.mdl", **values):
    path = tmp_path / name
    cstorch.save(values or {"w": torch.arange(6.0)}, path)
    return path


def _replace_dataset(path, key, make):
    """Swaps dataset ``key`` for ``make(file, key)``, keeping its attributes."""
    import h5py

    with h5py.File(path, "r+") as f:
        attrs = dict(f[key].attrs)
        del f[key]
        make(f, key)
        if isinstance(f.get(key, getlink=True), h5py.HardLink):
            f[key].attrs.update(attrs)


@pytest.fixture
def secret(tmp_path):
    """A file outside the checkpoints' directory that a crafted checkpoint tries to read."""
    import h5py

    elsewhere = tmp_path.parent / f"{tmp_path.name}_elsewhere"
    elsewhere.mkdir(exist_ok=True)
    raw = elsewhere / "secret.bin"
    raw.write_bytes(np.arange(6, dtype=np.float32).tobytes())
    h5 = elsewhere / "secret.h5"
    with h5py.File(h5, "w") as f:
        f["data"] = np.arange(6, dtype=np.float32)
    return raw, h5


def test_defaultdict_factory_from_a_module_is_refused(tmp_path):
    import collections

    import h5py

    path = _checkpoint(tmp_path, d=collections.defaultdict(list, {"a": torch.ones(1)}))
    with h5py.File(path, "r+") as f:  # name posix.abort as the factory
        human, spec = json.loads(f.attrs["__spec__"])
        spec = spec.replace(
            '"default_factory_module": "builtins"', '"default_factory_module": "posix"'
        )
        spec = spec.replace('"default_factory_name": "list"', '"default_factory_name": "abort"')
        assert "posix" in spec and "abort" in spec
        f.attrs["__spec__"] = json.dumps([human, spec])
    with pytest.raises(TreeSpecError, match="posix.abort.*unsafe_allow_pickle"):
        cstorch.load(path)


@pytest.mark.parametrize("where", ["factory", "external_link"])
def test_names_from_a_checkpoint_are_quoted_short_in_its_errors(tmp_path, where):
    """A checkpoint is a foreign file: a name it holds (a defaultdict factory's module, an
    HDF5 link's target) is quoted by a short prefix, whatever its length (issue 49)."""
    import collections

    import h5py

    long = "m" * (5_000_000 if where == "factory" else 50_000)  # (HDF5's longest link)
    if where == "factory":
        path = _checkpoint(tmp_path, d=collections.defaultdict(list, {"a": torch.ones(1)}))
        with h5py.File(path, "r+") as f:
            human, spec = json.loads(f.attrs["__spec__"])
            spec = spec.replace(
                '"default_factory_module": "builtins"', f'"default_factory_module": "{long}"'
            )
            f.attrs["__spec__"] = json.dumps([human, spec])
        expected = TreeSpecError
    else:
        path = _checkpoint(tmp_path)
        _replace_dataset(
            path, "w", lambda f, key: f.__setitem__(key, h5py.ExternalLink(long, "data"))
        )
        expected = UntrustedCheckpointError
    with pytest.raises(expected) as info:
        torch.as_tensor(cstorch.load(path)["w"]) + 0
    message = str(info.value)
    assert len(message) < 1000, message[:300]
    assert "'mmmmm" in message and " characters)" in message


@pytest.mark.parametrize("kind", ["external_raw", "virtual", "external_link"])
def test_hdf5_features_that_read_other_files_are_refused(tmp_path, secret, kind):
    import h5py

    raw, h5 = secret

    def make(f, key):
        if kind == "external_raw":
            f.create_dataset(key, shape=(6,), dtype="f4", external=[(str(raw), 0, 24)])
        elif kind == "virtual":
            layout = h5py.VirtualLayout(shape=(6,), dtype="f4")
            layout[:] = h5py.VirtualSource(str(h5), "data", shape=(6,))
            f.create_virtual_dataset(key, layout)
        else:
            f[key] = h5py.ExternalLink(str(h5), "data")

    path = _checkpoint(tmp_path)
    _replace_dataset(path, "w", make)
    with pytest.raises(UntrustedCheckpointError, match="'w'.*unsafe_allow_pickle"):
        torch.as_tensor(cstorch.load(path)["w"]) + 0
    if kind != "external_link":  # the opt-in reads it (an ExternalLink loses our metadata)
        trusted = cstorch.load(path, unsafe_allow_pickle=True)["w"]
        assert torch.equal(torch.as_tensor(trusted) + 0, torch.arange(6.0))


@pytest.mark.slow
def test_links_to_files_outside_the_checkpoint_directory_are_refused(tmp_path, secret):
    from tests.cstorch.storage.test_storage_fixtures import write_csx_style

    elsewhere = secret[0].parent / "other.mdl"
    if not elsewhere.exists():
        cstorch.save({"w": torch.arange(4.0).reshape(2, 2)}, elsewhere)
    path = tmp_path / "csx.mdl"
    write_csx_style(path, elsewhere)
    with pytest.raises(UntrustedCheckpointError, match="outside its directory"):
        cstorch.load(path)
    assert torch.equal(
        cstorch.load(path, unsafe_allow_pickle=True)["link"] + 0, torch.arange(4.0).reshape(2, 2)
    )


def test_a_small_file_cannot_make_the_loader_allocate_unbounded_memory(tmp_path):
    def make(f, key):  # 4 GiB declared, nothing stored
        f.create_dataset(key, shape=(1 << 30,), dtype="f4", chunks=(1 << 18,))

    path = _checkpoint(tmp_path)
    _replace_dataset(path, "w", make)
    assert os.path.getsize(path) < 1 << 20
    with pytest.raises(UntrustedCheckpointError, match="declares 4294967296 bytes"):
        torch.as_tensor(cstorch.load(path)["w"]) + 0


# ------------------------------------------------------------------ disk full
_DISK_FULL = textwrap.dedent("""
    import glob, os, resource, signal, sys
    import torch
    import cerebras.pytorch as cstorch

    out = sys.argv[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    path = os.path.join(out, "big.mdl")
    try:
        cstorch.save({"w": torch.randn(1024, 1024)}, path)
    except OSError as error:
        print("ERROR", error.errno, error)
    print("LEFT", sorted(os.listdir(out)))
    cstorch.save({"b": torch.arange(3.0)}, os.path.join(out, "small.mdl"))
    print("SMALL", cstorch.load(os.path.join(out, "small.mdl"))["b"].tolist())
""")


@pytest.mark.slow
def test_disk_full_during_save_raises_one_clear_oserror(tmp_path):
    result = fork_server.run(
        [sys.executable, "-c", _DISK_FULL, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]  # no SIGSEGV, process healthy
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["ERROR"].startswith("27 ")  # EFBIG
    assert "big.mdl" in lines["ERROR"] and "needs about" in lines["ERROR"]
    assert lines["LEFT"] == "[]"  # no checkpoint, no temporary file
    assert lines["SMALL"] == "[0.0, 1.0, 2.0]"
    assert "Exception ignored" not in result.stderr


# ------------------------------------------------------------------ concurrent saves
@pytest.mark.parametrize("publish", ["link", "renameat2", "reserve"])
def test_concurrent_exclusive_saves_to_one_path_never_replace_each_other(
    tmp_path, monkeypatch, publish
):
    import threading

    from tests.jax_backend.test_atomic_files import use_publish

    use_publish(monkeypatch, publish)
    path = tmp_path / "shared.mdl"
    barrier = threading.Barrier(6)
    results = {}

    def save(i):
        barrier.wait()
        try:
            cstorch.save({"writer": torch.full((256,), float(i))}, path, exist_ok=False)
            results[i] = "saved"
        except FileExistsError:
            results[i] = "exists"

    threads = [threading.Thread(target=save, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in results.items() if r == "saved"]
    assert len(results) == 6 and len(winners) == 1, results
    stored = cstorch.load(path)["writer"]
    assert torch.equal(stored + 0, torch.full((256,), float(winners[0])))
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


@pytest.mark.slow
@pytest.mark.heavy
def test_two_processes_overwriting_one_path_while_a_reader_loads(tmp_path):
    # The default save replaces the file atomically: whatever a reader opens is one writer's
    # whole checkpoint (its payload all one value, matching its tag), never a mix or a torn file.
    path = tmp_path / "shared.mdl"
    writer = textwrap.dedent("""
        import sys, torch
        from cstorch.storage import save
        path, tag = sys.argv[1], float(sys.argv[2])
        for i in range(40):
            save({"tag": tag, "i": i, "w": torch.full((64, 1024), tag * 1000 + i)}, path)
    """)
    cstorch.save({"tag": 0.0, "i": 0, "w": torch.zeros(64, 1024)}, path)
    procs = [
        subprocess.Popen([sys.executable, "-c", writer, str(path), str(tag)]) for tag in (1.0, 2.0)
    ]
    seen = set()
    while True:
        done = all(p.poll() is not None for p in procs)
        state = cstorch.load(path)
        w = state["w"] + 0
        expected = state["tag"] * 1000 + state["i"]
        assert torch.equal(w, torch.full((64, 1024), float(expected))), (state["tag"], state["i"])
        seen.add(state["tag"])
        if done:
            break
    assert [p.returncode for p in procs] == [0, 0]
    assert state["i"] == 39 and state["tag"] in (1.0, 2.0)  # the last replace wins, whole
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


# ------------------------------------------------------------------ leftovers of killed saves
def test_stray_temp_files_are_named_on_load_and_cleaned_by_the_next_save(tmp_path):
    import fcntl

    target = tmp_path / "model.mdl"
    dead = tmp_path / "model.mdl.deadbeef.tmp"
    dead.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))  # a save killed early
    live = tmp_path / "model.mdl.0123abcd.tmp"
    live.write_bytes(b"")
    young = tmp_path / "model.mdl.0000beef.tmp"  # just created: its writer may lock it next
    young.write_bytes(b"")
    for leftover in (dead, live):
        os.utime(leftover, (0, 0))
    with pytest.raises(RuntimeError, match="did not finish"):
        cstorch.load(dead)
    with open(live, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # a writer that is still running
        cstorch.save({"w": torch.ones(2)}, target)
        assert not dead.exists() and live.exists() and young.exists()
    assert torch.equal(cstorch.load(target)["w"] + 0, torch.ones(2))


# ------------------------------------------------------------------ bad input and small items
def test_generator_input_fn_shorter_than_num_steps_cycles(cpu_backend):
    from cstorch.utils.data import DataExecutor, DataLoader

    def batches(n):
        for i in range(n):
            yield torch.full((2, 1), float(i))

    executor = DataExecutor(DataLoader(batches, 3), num_steps=7)
    seen = [float(batch[0, 0]) for batch in executor]
    assert seen == [0, 1, 2, 0, 1, 2, 0]  # like a re-iterable loader


def test_one_shot_iterator_that_cannot_restart_raises_instead_of_hanging(cpu_backend):
    from cstorch.utils.data import DataExecutor, DataLoader

    shared = iter([torch.zeros(2, 1)] * 2)
    executor = DataExecutor(DataLoader(lambda: shared), num_steps=5)
    with pytest.raises(RuntimeError, match="ran out after 2 batches"):
        list(executor)


def test_torch_dataloader_workers_are_not_dropped_silently(cpu_backend):
    from cstorch.utils.data import DataLoader

    def input_fn():
        return torch.utils.data.DataLoader(
            torch.arange(8.0).reshape(4, 2), batch_size=2, num_workers=2
        )

    loader = DataLoader(input_fn)
    with pytest.warns(UserWarning, match="num_workers=2"):
        batches = list(loader)
    assert len(batches) == 2


def test_rng_state_restores_from_a_loaded_checkpoint(tmp_path):
    torch.manual_seed(3)
    state = torch.get_rng_state()
    expected = torch.rand(4)
    cstorch.save({"rng": state}, tmp_path / "rng.mdl")
    torch.set_rng_state(cstorch.load(tmp_path / "rng.mdl")["rng"])
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.slow
def test_add_param_group_mid_run_keeps_existing_moments(cpu_backend):
    torch.manual_seed(0)
    first, second = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1, bias=False)
    model = torch.nn.Sequential(first, second)
    compiled = cstorch.compile(model, cpu_backend)
    second.weight.requires_grad_(False)
    optimizer = cstorch.optim.Adam(first.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        loss = compiled(x).pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    x = torch.randn(4, 3)
    for _ in range(3):
        step(x)
    moments = copy.deepcopy(optimizer.state_dict()["state"])
    second.weight.requires_grad_(True)
    optimizer.add_param_group({"params": [second.weight]})
    after = optimizer.state_dict()["state"]
    for index, state in moments.items():
        for key, value in state.items():
            torch.testing.assert_close(after[index][key], value, rtol=0, atol=0)
    assert torch.equal(after[2]["exp_avg"], torch.zeros(1, 2))
    with pytest.warns(cstorch.core.compile.RecompilationWarning):
        step(x)  # the new group trains from here
    assert not torch.equal(optimizer.state_dict()["state"][2]["exp_avg"], torch.zeros(1, 2))


@pytest.mark.slow
def test_program_cache_is_bounded(cpu_backend):
    from cstorch.core import compile as compile_module

    cstorch.config.config.update("max_programs", 3)  # undone by cstorch.config.reset()
    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model, cpu_backend)

    @cstorch.trace
    def forward(x):
        return compiled(x).sum()

    with (
        pytest.warns(compile_module.RecompilationWarning, match="more than 3 signatures"),
        pytest.warns(compile_module.RecompilationWarning, match="signature changed"),
    ):
        for batch in range(1, 7):
            torch.testing.assert_close(
                forward(torch.ones(batch, 2)), model(torch.ones(batch, 2)).sum().detach()
            )
    assert len(forward.programs) == 3


def test_float64_input_into_a_float32_model_raises_like_eager(cpu_backend):
    model = torch.nn.Linear(3, 2)
    compiled = cstorch.compile(model, cpu_backend)

    @cstorch.trace
    def forward(x):
        return compiled(x).sum()

    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="same dtype"):
        model(x)  # eager torch
    with pytest.raises(RuntimeError, match="same dtype.*float64 and float32") as error:
        forward(x)
    message = str(error.value)
    assert "x.float()" in message and "cannot run on these inputs" in message
    assert "bug" not in message  # the user's input is what to fix, not the project


@pytest.mark.filterwarnings(
    "ignore::jax_backend.state.SharedStateWarning"
)  # pytest.raises keeps the rolled-back tensors
def test_a_step_result_that_cannot_be_read_is_dropped_not_kept_poisoned():
    """An asynchronous failure surfaces when the result is read: the state falls back to
    its last synchronised values with a clear error, instead of every later read and step
    re-raising it."""
    import jax.numpy as jnp

    def poisoned(model, optimizer, step):
        synced = copy.deepcopy(model.state_dict())
        state = cstorch.backend()._impl.device_state
        broken = jnp.ones((3, 4), dtype=jnp.float32)
        broken.delete()  # reading it fails, like the output of a step that failed on device
        state.update([model.weight], [broken])
        with pytest.raises(StepFailedError, match="rolled back"):
            model.state_dict()
        now = model.state_dict()  # readable again, with the last synchronised values
        torch.testing.assert_close(now["weight"], synced["weight"], rtol=0, atol=0)

    _run(poisoned, steps_after=2)


def test_checkpoints_are_synced_to_disk_before_they_are_published(tmp_path, monkeypatch):
    from cstorch.storage import h5_format

    events = []
    real_fsync, real_link, real_replace = os.fsync, os.link, os.replace
    monkeypatch.setattr(
        h5_format.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1]
    )
    monkeypatch.setattr(
        h5_format.os, "link", lambda a, b: (events.append("publish"), real_link(a, b))[1]
    )
    monkeypatch.setattr(
        h5_format.os, "replace", lambda a, b: (events.append("publish"), real_replace(a, b))[1]
    )
    for exist_ok in (True, False):  # overwrite (os.replace) and exclusive (os.link) publish
        events.clear()
        cstorch.save({"w": torch.ones(3)}, tmp_path / f"synced_{exist_ok}.mdl", exist_ok=exist_ok)
        assert events[:2] == ["fsync", "publish"]  # the file, then (after) its directory
        assert events.count("fsync") == 2


@pytest.mark.parametrize(
    "make",
    [
        lambda params: cstorch.optim.AdamW(params, lr=0.1),
        lambda params: cstorch.optim.SGD(params, lr=0.1, momentum=0.9),
    ],
    ids=["AdamW", "SGD"],
)
def test_optimizer_state_of_another_model_is_refused_naming_the_shapes(cpu_backend, make):
    """Same number of parameters, other shapes: torch's load_state_dict accepts it, and the
    first step failed with a lowering error asking to report a bug in the project (issue 31,
    item 5). It is refused at load_state_dict, with both models' shapes, changing nothing."""
    other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    foreign = make(other.parameters()).state_dict()
    compiled = cstorch.compile(model, cpu_backend)
    optimizer = make(model.parameters())
    before = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(ValueError) as info:
        optimizer.load_state_dict(foreign)
    message = str(info.value)
    assert "from a model with other parameter shapes" in message, message
    assert "(8, 4) in the state_dict, (4, 8) here" in message, message
    assert "parameter 0 of param group 0" in message
    after = optimizer.state_dict()
    for key, state in before["state"].items():
        for name, value in state.items():
            torch.testing.assert_close(after["state"][key][name], value)

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    optimizer.load_state_dict(before)  # its own state still loads, and training goes on
    assert torch.isfinite(step(torch.ones(3, 8)).clone())
