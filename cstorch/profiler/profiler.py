"""The op profiler of CSX runs: ``profile(schedule=schedule(start_step=, end_step=))``.

Inside a ``with profile(...)`` block, the next data executor run on the CSX backend records
the steps ``start_step..end_step`` (1-based, inclusive). On a Cerebras system the appliance
returns per-op timings; the modeled wafer records the wall-clock span of each step, which
``get_summary()`` tabulates and ``export_chrome_trace(path)`` writes in Chrome trace format.
Profiling is refused on the CPU and GPU backends, as in the reference.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from typing import Any, Callable, List, Optional

from jax_backend.errors import CstorchRuntimeError, CstorchValueError


class ProfilerRegistry:
    """Holds the one active ``profile``."""

    _profiler = None

    @classmethod
    def set_profiler(cls, profiler) -> None:
        if cls._profiler is not None:
            raise CstorchRuntimeError(
                "A profiler has already been set. Only one profiler instance is "
                "allowed at a time; exit the active `profile` block first."
            )
        cls._profiler = profiler

    @classmethod
    def get_profiler(cls):
        return cls._profiler

    @classmethod
    def unset_profiler(cls) -> None:
        cls._profiler = None


def schedule(*, start_step: int, end_step: int) -> Callable[[], List[int]]:
    """The steps to profile, ``start_step..end_step`` inclusive (-1 start disables)."""
    if start_step > end_step:
        raise CstorchValueError(
            f"The start step ({start_step}) must be less than or equal to the end "
            f"step ({end_step})."
        )

    def steps() -> List[int]:
        return [start_step, end_step]

    return steps


def tensorboard_trace_handler(
    dir_name: str, worker_name: Optional[str] = None, use_gzip: bool = False
):
    """An ``on_trace_ready`` handler writing ``<worker>.<ns>.pt.trace.json[.gz]`` into
    ``dir_name`` for TensorBoard's profiler plugin (``profile`` requires the
    ``torch_tb_profiler`` package with this handler)."""

    def handler(prof) -> None:
        name = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        os.makedirs(dir_name, exist_ok=True)
        file_name = f"{name}.{time.time_ns()}.pt.trace.json" + (".gz" if use_gzip else "")
        prof.export_chrome_trace(os.path.join(dir_name, file_name))

    handler.origin = tensorboard_trace_handler
    return handler


_HOST = re.compile(r"^([A-Z]+)-(\d+|\*)$")


class profile:
    """A context manager that profiles the scheduled steps of the next CSX run.

    Args:
        schedule: from ``cstorch.profiler.schedule``.
        host_activities: hosts to profile besides the wafer, e.g. ["ACT-0", "WGT-*", "CSX-1"].
        on_trace_ready: called with this profiler once the profiled steps have run.
    """

    def __init__(
        self,
        *,
        schedule: Callable[[], List[int]],
        host_activities: Optional[List[str]] = None,
        on_trace_ready: Optional[Callable[..., Any]] = None,
    ):
        if getattr(on_trace_ready, "origin", None) is tensorboard_trace_handler:
            import importlib.util

            if importlib.util.find_spec("torch_tb_profiler") is None:
                raise ImportError(
                    "TensorBoard trace viewing requires the pip package "
                    "`torch_tb_profiler`; install it for TensorBoard support."
                )
        self.schedule = schedule
        self.host_activities = host_activities
        self.on_trace_ready = on_trace_ready
        self.trace_events: List[dict] = []
        self._window = None

    def __enter__(self):
        ProfilerRegistry.set_profiler(self)
        return self

    def __exit__(self, *exc):
        ProfilerRegistry.unset_profiler()
        return False

    # ------------------------------------------------------------------ executor side
    def configure_profiler(self, is_csx: bool, num_steps: int):
        """Validates the schedule for a run of ``num_steps``; returns (start, end) or None."""
        start, end = self.schedule()
        if start == -1:
            return None
        if not is_csx:
            if start >= 0:
                raise CstorchRuntimeError("Only CSX backend can be profiled.")
            return None
        if not num_steps >= end >= start >= 1:
            raise CstorchValueError(
                f"The profiling step range must lie within [1, {num_steps}], got {start}:{end}."
            )
        for host in self.host_activities or []:
            match = _HOST.match(host)
            if match is None or match.group(1) not in ("ACT", "WGT", "CSX"):
                raise CstorchValueError(
                    f"Invalid host activity {host!r}: use <ACT|WGT|CSX>-<number or "
                    "*>, e.g. ACT-0, WGT-*, CSX-1."
                )
        self._window = (start, end)
        self.trace_events = []
        return self._window

    def record_step(self, step: int, start_ns: int, end_ns: int) -> None:
        """Records user step ``step`` (1-based) if it is in the profiled window."""
        if self._window is None or not self._window[0] <= step <= self._window[1]:
            return
        self.trace_events.append(
            {
                "name": f"step {step}",
                "ph": "X",
                "pid": 0,
                "tid": 0,
                "ts": start_ns / 1e3,
                "dur": (end_ns - start_ns) / 1e3,
            }
        )
        if step == self._window[1] and self.on_trace_ready is not None:
            self.on_trace_ready(self)

    # ------------------------------------------------------------------ results
    @property
    def op_profiler_json(self) -> Optional[dict]:
        """The profile as the Chrome-trace JSON object, or None when no step was profiled
        (releases 2.0-2.2 exposed the appliance's profile here; their Model Zoo prints the
        summary only when it is set)."""
        if not self.trace_events:
            return None
        return {"traceEvents": list(self.trace_events)}

    def get_summary(self) -> Optional[str]:
        """A table of the profiled steps and their times (None before any was recorded)."""
        if not self.trace_events:
            return None
        total = sum(e["dur"] for e in self.trace_events)
        rows = [f"{'STEP':<12}{'TIME (ms)':>12}{'% TIME':>10}"]
        rows += [
            f"{e['name']:<12}{e['dur'] / 1e3:>12.3f}{100 * e['dur'] / total:>10.1f}"
            for e in self.trace_events
        ]
        return "\n".join(rows)

    def export_chrome_trace(self, path: str) -> None:
        """Writes the recorded events as a Chrome trace (JSON)."""
        if not self.trace_events:
            return
        with open(path, "w") as f:
            json.dump({"traceEvents": self.trace_events, "displayTimeUnit": "ns"}, f, indent=2)
