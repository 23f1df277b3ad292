"""``RateTracker``: samples per second, smoothed since the last query and over the whole run.

(Minimal version for the Model Zoo's profiler; issue 12 owns the rate tracker's semantics.)
"""

from __future__ import annotations

import time


class RateTracker:
    def __init__(self, smooth_factor: float | None = None):
        self._smooth_factor = 0.4 if smooth_factor is None else smooth_factor
        self.reset()

    def reset(self) -> None:
        self.reset_time()
        self._counted = 0.0  # samples already reported by rate()
        self._pending = 0.0  # samples added since the last rate()
        self._last_rate = None

    def reset_time(self, offset: float = 0) -> None:
        """Restarts the clock, ``offset`` seconds in the past."""
        self._start_ns = time.perf_counter_ns() - int(offset * 1e9)
        self._last_ns = self._start_ns

    def add(self, count) -> None:
        self._pending += count

    @property
    def total_count(self) -> float:
        return self._counted + self._pending

    def rate(self) -> float:
        """Samples/s since the previous call, exponentially smoothed with the previous rate."""
        now = time.perf_counter_ns()
        delta = (now - self._last_ns) / 1e9
        if delta <= 0:
            return 0.0
        rate = self._pending / delta
        if self._last_rate is not None:
            rate = (1 - self._smooth_factor) * rate + self._smooth_factor * self._last_rate
        self._counted += self._pending
        self._pending = 0.0
        self._last_ns = now
        self._last_rate = rate
        return rate

    def global_rate(self) -> float:
        """Samples/s since the clock started (not smoothed)."""
        elapsed = self.elapsed_seconds()
        return self.total_count / elapsed if elapsed > 0 else 0.0

    def elapsed_seconds(self) -> float:
        return (time.perf_counter_ns() - self._start_ns) / 1e9
