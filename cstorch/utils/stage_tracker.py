"""``StageTracker``: nested wall-clock stages of a backend's life, flushed as ``track.json``.

The file has the reference's layout: ``{stage: [seconds, {child stage: [...], ...}], ...}``,
where a stage that is still running counts 0 seconds.
"""

from __future__ import annotations

import json
import time


class _Stage:
    def __init__(self, name: str):
        self.name = name
        self.seconds = 0.0
        self.started_ns = None
        self.children: list[_Stage] = []

    def total(self):
        return [round(self.seconds, 7), {c.name: c.total() for c in self.children}]


class StageTracker:
    def __init__(self):
        self._root = _Stage("")
        self._stack = [self._root]

    def start(self, name: str) -> None:
        if any(s.name == name for s in self._stack[1:]):
            raise NameError(f"Stage {name!r} is already running.")
        stage = _Stage(name)
        stage.started_ns = time.time_ns()
        self._stack[-1].children.append(stage)
        self._stack.append(stage)

    def stop(self, name: str) -> None:
        """Stops ``name`` and every stage started inside it (no-op if it is not running)."""
        if not any(s.name == name for s in self._stack[1:]):
            return
        while True:
            stage = self._stack.pop()
            stage.seconds += (time.time_ns() - stage.started_ns) / 1e9
            stage.started_ns = None
            if stage.name == name:
                return

    def totals(self) -> dict:
        return self._root.total()[1]

    def flush(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.totals(), f, indent=4)
