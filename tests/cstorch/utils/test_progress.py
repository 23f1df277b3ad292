"""The progress display of a loop (cstorch.utils.progress through the DataExecutor): plain lines
off a terminal with a steady rate and a correct ETA, a bar on one, and its switches.

The clock is a fake one advanced by the loop (``progress.time``), so the expected rates and
times are exact: no test here depends on how fast the machine is.
"""

from __future__ import annotations

import io
import re
import sys
import textwrap

import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.utils import progress
from cstorch.utils.data import DataExecutor, DataLoader

# A 200-step loop whose first step "takes" 3 s (the compile) and every later one 0.25 s on a
# fake clock; the step returns its loss, batches are 64 samples.
LOOP = textwrap.dedent("""
    import torch
    import cerebras.pytorch as cstorch
    from cstorch.utils import progress

    class Clock:
        now = 100.0
        @classmethod
        def perf_counter(cls):
            return cls.now

    progress.time = Clock

    backend = cstorch.backend("CPU")
    model = torch.nn.Linear(4, 1)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.01)

    @cstorch.trace
    def step(x):
        loss = compiled(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    @cstorch.step_closure
    def keep(loss):
        losses.append(loss.item())

    losses = []
    batches = lambda: [torch.full((64, 4), 0.5)]
    for i, x in enumerate(cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(batches), num_steps=200), start=1):
        keep(step(x))
        Clock.now += 3.0 if i == 1 else 0.25
    print("LOSSES", " ".join(repr(v) for v in losses))
""")


def _run_piped(monkeypatch, capsys, **env):
    """The loop as a script whose output is not a terminal (captured), with ``env`` and none
    of the other switches set; in this process, as a fresh one would run it (the backend is
    reset per test, the fake clock put back afterwards)."""
    for name in ("CSTORCH_PROGRESS", "CSTORCH_PROGRESS_BAR", "CSTORCH_PROGRESS_EVERY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(progress, "time", progress.time)  # the loop replaces it
    cstorch.config.reset()
    capsys.readouterr()
    exec(compile(LOOP, "loop.py", "exec"), {"__name__": "__main__"})
    return capsys.readouterr().out


@pytest.mark.slow
def test_a_piped_200_step_loop_prints_lines_with_the_steady_rate_and_a_correct_eta(
    monkeypatch, capsys
):
    out = _run_piped(monkeypatch, capsys)
    assert "\r" not in out and "\033" not in out
    lines = out.splitlines()
    assert lines[0] == (
        "run: device CPU (1 x cpu) | precision float32 | 5 parameters | 200 steps | batch 64"
    )
    assert lines[1] == "compiling the step (capture and XLA compile)..."
    losses = [progress.format_loss(float(v)) for v in lines[-1].split()[1:]]
    progress_lines = [line for line in lines if line.startswith("train ")]
    # the first step, then every tenth step (a twentieth of the run), and the last
    assert [int(line.split()[1].split("/")[0]) for line in progress_lines] == [1] + list(
        range(10, 201, 10)
    )
    assert progress_lines[0] == f"train 1/200 | loss {losses[0]} | first step 3.0 s (compiling)"
    for line in progress_lines[1:-1]:
        done = int(line.split()[1].split("/")[0])
        # steady: 64 samples every 0.25 s, the compile left out; the time left is what the
        # remaining steps take at that pace
        eta = progress.format_duration(0.25 * (200 - done))
        assert line == (
            f"train {done}/200 | loss {losses[done - 1]} | 256.0 samples/s | ETA {eta}"
        ), line
    assert "ETA 0:48" in progress_lines[1] and "ETA 0:25" in progress_lines[10]
    # the whole run: 3 s + 199 x 0.25 s
    assert progress_lines[-1] == f"train 200/200 | loss {losses[-1]} | 256.0 samples/s | took 0:53"


@pytest.mark.slow
def test_a_later_runs_first_step_says_compiling_only_when_it_compiled(monkeypatch, capsys):
    """A second DataExecutor over the same step compiles nothing: its first line gives the
    first step's time without "(compiling)"."""
    second = LOOP.replace(
        'print("LOSSES"',
        'print("SECOND RUN")\n'
        "for i, x in enumerate(cstorch.utils.data.DataExecutor(\n"
        "        cstorch.utils.data.DataLoader(batches), num_steps=60), start=1):\n"
        "    keep(step(x))\n"
        "    Clock.now += 3.0 if i == 1 else 0.25\n"
        'print("LOSSES"',
    )
    monkeypatch.setattr(sys.modules[__name__], "LOOP", second)
    out = _run_piped(monkeypatch, capsys).split("SECOND RUN")
    assert "compiling the step (capture and XLA compile)..." in out[0]
    assert "(compiling)" in out[0]
    assert "first step..." in out[1] and "compiling" not in out[1]
    assert re.search(r"^train 1/60 \| loss \S+ \| first step 3\.0 s$", out[1], re.M)


@pytest.mark.slow
def test_lines_come_every_30_seconds_when_steps_are_sparse_and_can_be_turned_off(
    monkeypatch, capsys
):
    out = _run_piped(monkeypatch, capsys, CSTORCH_PROGRESS_EVERY="1000")
    shown = [
        int(line.split()[1].split("/")[0]) for line in out.splitlines() if line.startswith("train ")
    ]
    # step 1 ends at 103 s; 30 s later (120 steps of 0.25 s) is step 121; then the last
    assert shown == [1, 121, 200]
    out = _run_piped(monkeypatch, capsys, CSTORCH_PROGRESS="off")
    assert out.splitlines()[0].startswith("LOSSES")
    out = _run_piped(monkeypatch, capsys, CSTORCH_PROGRESS_BAR="0")  # the older switch
    assert out.splitlines()[0].startswith("LOSSES")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_display_depends_on_the_output_and_the_switches(monkeypatch):
    for name in ("CSTORCH_PROGRESS", "CSTORCH_PROGRESS_BAR"):
        monkeypatch.delenv(name, raising=False)
    assert progress.mode(1000, io.StringIO()) == "lines"  # a pipe, a file, a notebook
    assert progress.mode(1000, Terminal()) == "bar"
    assert progress.mode(10, Terminal()) == "off"  # a short run shows nothing by default
    assert progress.mode(10, io.StringIO(), any_length=True) == "lines"
    monkeypatch.setenv("CSTORCH_PROGRESS_BAR", "1")
    assert progress.mode(10, io.StringIO()) == "bar"
    monkeypatch.setenv("CSTORCH_PROGRESS_BAR", "0")
    assert progress.mode(1000, Terminal()) == "off"
    monkeypatch.setenv("CSTORCH_PROGRESS", "lines")  # wins over the older switch
    assert progress.mode(1000, Terminal()) == "lines"
    monkeypatch.setenv("CSTORCH_PROGRESS", "sometimes")
    with pytest.raises(
        ValueError,
        match=r"Invalid cstorch setting progress='sometimes' \(from "
        r"the environment variable CSTORCH_PROGRESS\): must be one of auto, bar, "
        r"lines, off\.",
    ):
        progress.mode(1000, Terminal())


def test_number_formats_are_the_same_everywhere():
    assert [progress.format_loss(v) for v in (2.302585, 0.0421, 0.0, 1.5e-5, 123456.0)] == [
        "2.3026",
        "0.0421",
        "0.0000",
        "1.500e-05",
        "1.235e+05",
    ]
    assert progress.format_loss(float("nan")) == "nan"
    assert [progress.format_duration(s) for s in (0.4, 59.6, 61, 3600 * 2 + 61)] == [
        "0:00",
        "1:00",
        "1:01",
        "2:01:01",
    ]
    assert progress.format_rate(1234.56, 19.3) == "1,234.6 samples/s"
    assert progress.format_rate(None, 19.3) == "19.30 steps/s"  # batches without a size


def test_the_bar_keeps_printed_lines_apart_and_shows_the_eta(cpu_backend, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setenv("CSTORCH_PROGRESS", "bar")
    clock = [50.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])

    @cstorch.step_closure
    def report(i):
        print(f"closure line {i}")

    for i, _ in enumerate(DataExecutor(DataLoader(lambda: [torch.zeros(2, 1)] * 4), num_steps=4)):
        report(i)
        clock[0] += 2.0 if i == 0 else 1.0  # > the redraw interval: every step is drawn
    text = terminal.getvalue()
    frames = text.split("\r\033[K")
    assert "compiling the step (capture and XLA compile)..." in frames
    bars = list(dict.fromkeys(f for f in frames if f.startswith("train [")))  # no redraws
    # (no step is compiled in this loop: its first step's time is not called compiling)
    assert bars[0] == "train [" + "=" * 6 + " " * 18 + "] 1/4 | first step 2.0 s"
    assert bars[1] == "train [" + "=" * 12 + " " * 12 + "] 2/4 | 2.0 samples/s | ETA 0:02"
    assert bars[-1] == "train [" + "=" * 24 + "] 4/4 | 2.0 samples/s | took 0:05\n"  # kept
    for i in range(4):  # each printed line starts on a cleared line, not after the bar
        assert text.split(f"closure line {i}")[0].endswith("\r\033[K")


def test_a_short_run_shows_nothing_unless_asked(cpu_backend, monkeypatch, capsys):
    for name in ("CSTORCH_PROGRESS", "CSTORCH_PROGRESS_BAR"):
        monkeypatch.delenv(name, raising=False)
    for _ in DataExecutor(DataLoader(lambda: [torch.zeros(2, 1)]), num_steps=10):
        pass
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("CSTORCH_PROGRESS", "lines")
    for _ in DataExecutor(DataLoader(lambda: [torch.zeros(2, 1)]), num_steps=3):
        pass
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("run: device CPU") and out[0].endswith("| 3 steps | batch 2")
    assert [line.split(" |")[0] for line in out[2:]] == ["train 1/3", "train 2/3", "train 3/3"]
    assert re.search(r"took \d+:\d\d$", out[-1])


@pytest.mark.parametrize(
    "name, value, rule",
    [
        ("progress_every", 0, "must be a positive integer"),
        ("progress_every", "10", r"must be a positive integer \(a number, not a string\)"),
        ("progress_seconds", "30", r"must be a number >= 0 \(a number, not a string\)"),
        ("progress_seconds", float("nan"), "must be a number >= 0"),
        ("progress", "sometimes", "must be one of auto, bar, lines, off"),
        ("progress_bar", "yes", "must be True or False"),
        ("progress_bar_min_steps", -1, "must be an integer >= 0"),
    ],
)
def test_a_progress_value_given_through_config_is_refused_when_given(
    monkeypatch, name, value, rule
):
    """``cstorch.config.config.update`` is the other spelling of the environment switches:
    a value the display cannot use is refused there, in the one form naming the setting (it
    used to end a run after its first step with ZeroDivisionError or TypeError from inside
    the display) (issue 49, item 3)."""
    from cstorch import config

    monkeypatch.delenv(config.config[name].env_var or "-", raising=False)
    with pytest.raises(
        config.SettingError,
        match=rf"^Invalid cstorch setting {name}=.* \(from "
        rf"config.update\): {rule}\. \S",
    ):
        config.config.update(name, value)
    assert config.config.value(name) == config.config[name].default  # nothing was stored


def test_progress_values_given_through_config_are_used(monkeypatch):
    from cstorch import config

    config.config.update("progress", " LINES ")
    config.config.update("progress_every", 7)
    config.config.update("progress_seconds", 0)  # a line on every step's time
    assert progress.mode(1000, Terminal()) == "lines"
    assert progress.line_every(1000) == 7
    assert progress.RunProgress(10, stream=io.StringIO()).seconds == 0
