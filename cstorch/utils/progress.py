"""How a run shows its progress: one format for loops (``DataExecutor``) and the Trainer.

Two displays share every field and number format:

* on a terminal, one bar, redrawn at most every half second::

    train [=========               ] 80/200 | loss 0.4213 | 5,512.3 samples/s | ETA 0:02

* anywhere else (CI logs, ``| tee``, notebooks), a plain line every ``N`` steps or every 30 s,
  whichever comes first, and at the first and last step::

    train 80/200 | loss 0.4213 | 5,512.3 samples/s | ETA 0:02

The first step captures and compiles the program, so its time is shown on its own ("first
step 1.4 s") and left out of the rate: the rate and the ETA are "steady", measured from the
end of the first step. The clock is read when the step's values exist (the display waits for
them on the steps it shows), so an asynchronous dispatch is not mistaken for a finished step.

Switches (``cstorch.config``; also environment variables): ``CSTORCH_PROGRESS`` is ``auto``
(the default: a bar on a terminal, lines elsewhere), ``bar``, ``lines`` or ``off``;
``CSTORCH_PROGRESS_BAR=1``/``0`` is the older spelling of ``bar``/``off``;
``CSTORCH_PROGRESS_EVERY`` (steps between lines; default a twentieth of the run) and
``CSTORCH_PROGRESS_SECONDS`` (30) set the cadence of lines. Runs shorter than
``progress_bar_min_steps`` (50) show nothing unless a mode is forced.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time

from cstorch import config

#: Seconds between redraws of the terminal bar.
BAR_REFRESH_SECONDS = 0.5
BAR_WIDTH = 24


# ----------------------------------------------------------------------------- number formats
def format_duration(seconds: float) -> str:
    """``M:SS`` under an hour, ``H:MM:SS`` from an hour on."""
    seconds = int(round(max(seconds, 0.0)))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def format_loss(value: float) -> str:
    """Four decimals (``0.4213``), or scientific notation where that would hide the value."""
    if not math.isfinite(value):
        return str(value)
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4f}"
    return f"{value:.3e}"


def format_rate(samples_per_second: float | None, steps_per_second: float) -> str:
    if samples_per_second:
        return f"{samples_per_second:,.1f} samples/s"
    return f"{steps_per_second:,.2f} steps/s"


def format_count(count: int) -> str:
    return f"{count:,}"


# ------------------------------------------------------------------------------------- mode
def mode(num_steps: int | None, stream, *, any_length: bool = False) -> str:
    """``"bar"``, ``"lines"`` or ``"off"`` for a run of ``num_steps`` on ``stream``
    (``any_length``: short runs too, for a display the user asked for)."""
    chosen = config.progress.value
    forced_bar = config.progress_bar.value
    if chosen == "auto" and forced_bar is not None:
        chosen = "bar" if forced_bar else "off"
    if chosen != "auto":
        return chosen
    if not any_length and (not num_steps or num_steps < config.progress_bar_min_steps.value):
        return "off"
    isatty = getattr(stream, "isatty", None)
    return "bar" if isatty is not None and isatty() else "lines"


def line_every(num_steps: int | None) -> int:
    """Steps between plain lines: ``CSTORCH_PROGRESS_EVERY``, else a twentieth of the run."""
    every = config.progress_every.value
    if every is not None:
        return every
    return max(1, math.ceil((num_steps or 20) / 20))


# ------------------------------------------------------------------------------------- run
class RunProgress:
    """The progress of one loop of ``total`` steps (see the module docstring).

    The caller says when each step is done (``step``) and whether its line is due
    (``due``: check before asking for the loss, which costs a wait for the step's values).
    ``write`` prints a permanent line (above the bar on a terminal).
    """

    def __init__(
        self,
        total: int | None,
        *,
        label: str = "train",
        stream=None,
        display: str | None = None,
        first: int = 0,
    ):
        self.stream = stream if stream is not None else sys.stdout
        self.total = total
        self.label = label
        self.display = display if display is not None else mode(total, self.stream)
        self.every = line_every(total)
        self.seconds = config.progress_seconds.value
        self.first = first  # the step count before this loop (a fit's global step)
        self._bar = ""  # the bar as last drawn ("" when none is shown)
        self._started = time.perf_counter()
        # Steady time: segments from the end of a loop's first step to its last step's end
        # (a fit's training loops are separated by validations, which do not count).
        self._steady_since = None  # the start of the running segment (None between loops)
        self._steady_before = 0.0  # seconds of the segments before it
        self._last_step_end = None
        self._steady_steps = 0
        self._steady_samples = 0
        self._last_shown = self._started
        self.first_step_seconds = None
        self.compiles = True  # whether the first step compiles (said in its line)
        self._hidden = ""  # the bar taken off the screen by clear(), for restore()
        self.done = first

    @property
    def active(self) -> bool:
        return self.display != "off"

    # -------------------------------------------------------------------- cadence
    def due(self, done: int) -> bool:
        """Whether step ``done`` is shown (so the caller should fetch its loss)."""
        if not self.active:
            return False
        last = self.total is not None and done >= self.total
        if done - self.first <= 1 or last:
            return True
        elapsed = time.perf_counter() - self._last_shown
        if self.display == "bar":
            return elapsed >= BAR_REFRESH_SECONDS
        return (done - self.first) % self.every == 0 or elapsed >= self.seconds

    # ------------------------------------------------------------------------ steps
    def step(
        self, done: int, samples: int = 0, loss: float | None = None, shown: bool | None = None
    ) -> None:
        """Step ``done`` has finished (its values exist when ``shown``), with ``samples``
        samples; ``loss`` is its loss where known."""
        now = time.perf_counter()
        self.done = done
        if self._steady_since is None:  # a loop's first step: its time is not steady
            if self.first_step_seconds is None:
                self.first_step_seconds = now - self._started
            self._steady_since = now
        else:
            self._steady_steps += 1
            self._steady_samples += samples
        self._last_step_end = now
        if shown is None:
            shown = self.due(done)
        if not shown or not self.active:
            return
        self._last_shown = now
        text = self.text(loss, now)
        if self.display == "bar":
            self._draw(text)
        else:
            self._write_line(text)

    def pause(self) -> None:
        """A loop ended (say, for a validation): time until the next loop's first step ends
        is not steady time."""
        if self._steady_since is not None and self._last_step_end is not None:
            self._steady_before += self._last_step_end - self._steady_since
        self._steady_since = None

    def _steady_seconds(self, now: float) -> float:
        running = now - self._steady_since if self._steady_since is not None else 0.0
        return self._steady_before + running

    def text(self, loss: float | None = None, now: float | None = None) -> str:
        now = time.perf_counter() if now is None else now
        done, total = self.done, self.total
        if self.display == "bar" and total:
            filled = BAR_WIDTH * min(done, total) // total
            parts = [f"{self.label} [{'=' * filled}{' ' * (BAR_WIDTH - filled)}] {done}/{total}"]
        else:
            parts = [f"{self.label} {done}/{total}" if total else f"{self.label} {done}"]
        if loss is not None:
            parts.append(f"loss {format_loss(loss)}")
        steady = self._steady_seconds(now)
        if self._steady_steps and steady > 0:
            samples = self._steady_samples / steady
            parts.append(format_rate(samples, self._steady_steps / steady))
            if total and done < total:
                parts.append(f"ETA {format_duration(steady / self._steady_steps * (total - done))}")
            elif total:
                parts.append(f"took {format_duration(now - self._started)}")
        elif total and done >= total:
            parts.append(f"took {format_duration(now - self._started)}")
        elif self.first_step_seconds is not None:
            parts.append(
                f"first step {self.first_step_seconds:.1f} s"
                + (" (compiling)" if self.compiles else "")
            )
        return " | ".join(parts)

    def steady_rate(self) -> float | None:
        """Samples per second after the first step (None before the second step)."""
        end = self._last_step_end if self._steady_since is not None else None
        steady = self._steady_seconds(end) if end is not None else self._steady_before
        return self._steady_samples / steady if self._steady_steps and steady > 0 else None

    # ---------------------------------------------------------------------- output
    def write(self, text: str) -> None:
        """A permanent line (above the bar on a terminal)."""
        bar = self._bar
        self._clear()
        self.stream.write(text + "\n")
        if bar:
            self._draw(bar)
        self.stream.flush()

    def _write_line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def _draw(self, text: str) -> None:
        self.stream.write("\r\033[K" + text)
        self.stream.flush()
        self._bar = text
        self._hidden = ""

    def _clear(self) -> None:
        if self._bar:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._bar = ""

    def clear(self) -> None:
        """Takes the bar off the screen (another display takes its place for a while)."""
        self._hidden = self._bar or self._hidden
        self._clear()

    def restore(self) -> None:
        """Draws again the bar that ``clear`` took off."""
        if self._hidden and not self._bar:
            self._draw(self._hidden)
        self._hidden = ""

    def show_status(self, text: str) -> None:
        """A transient status ("compiling the step...") in the bar's place, or a line."""
        if self.display == "bar":
            self._draw(text)
        elif self.active:
            self._write_line(text)

    @contextlib.contextmanager
    def printing(self):
        """Around code that may print: the bar is cleared first and redrawn after."""
        bar = self._bar
        self._clear()
        try:
            yield
        finally:
            if bar and not self._bar:
                self._draw(bar)

    def close(self) -> None:
        """Ends the bar's line (the last state stays on screen)."""
        if self._bar:
            self.stream.write("\n")
            self.stream.flush()
            self._bar = ""


def header(
    device: str, precision: str, parameters: int | None, steps: int | None, batch: int | None
) -> str:
    """The run's first line: what runs where."""
    parts = [f"device {device}", f"precision {precision}"]
    if parameters is not None:
        parts.append(f"{format_count(parameters)} parameters")
    if steps is not None:
        parts.append(f"{format_count(steps)} steps")
    if batch:
        parts.append(f"batch {format_count(batch)}")
    return "run: " + " | ".join(parts)


def run_header(impl, parameters: int | None, steps: int | None, batch: int | None) -> str:
    """The header of a run on backend ``impl``: its device, the precision of its steps."""
    from cstorch.backend import precision

    devices = impl.jax_devices
    platform = devices[0].platform if devices else "?"
    device = f"{impl.backend_type.name} ({len(devices)} x {platform})"
    if impl.engine == "eager":
        device += ", eager torch"
    half = precision.get_half_dtype_str() if precision.mixed_precision() else None
    return header(device, f"mixed {half}" if half else "float32", parameters or None, steps, batch)
