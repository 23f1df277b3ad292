"""``RateTracker``: samples per second, smoothed per reading and over a whole run.

Samples are counted with ``add``; each ``rate()`` reading covers the samples added since
the previous reading, blended with that previous reading (``smooth_factor`` is the weight
of the old value), and ``global_rate()`` covers everything since the last ``reset`` or
``reset_time``. The data executor's profiler resets the time after the first step, so
compilation does not count against the global rate.
"""

from __future__ import annotations

import time

from jax_backend.errors import CstorchValueError


class RateTracker:
    """Tracks how fast samples are processed (see the module docstring)."""

    def __init__(self, smooth_factor: float | None = None):
        smooth_factor = 0.4 if smooth_factor is None else smooth_factor
        if not 0.0 <= smooth_factor < 1.0:
            raise CstorchValueError(f"smooth_factor must be in [0, 1), got {smooth_factor}.")
        self._smooth_factor = smooth_factor
        self.reset()

    def reset(self) -> None:
        """Forgets every sample and starts the clock again."""
        self._counted = 0.0  # samples already covered by a rate() reading
        self._pending = 0.0  # samples added since the last reading
        self._last_rate = None
        self.reset_time()

    def reset_time(self, offset: float = 0.0) -> None:
        """Starts the clock again (``offset`` seconds ago) without forgetting samples."""
        now = time.time()
        self._start = now - offset
        self._last_reading = self._start

    def add(self, count) -> None:
        self._pending += count

    @property
    def total_count(self) -> float:
        return self._counted + self._pending

    def elapsed_seconds(self) -> float:
        """Seconds since the clock (re)started."""
        return time.time() - self._start

    def rate(self) -> float:
        """Smoothed samples per second since the previous reading (0.0 if no time passed)."""
        now = time.time()
        elapsed = now - self._last_reading
        if elapsed <= 0:
            return 0.0
        current = self._pending / elapsed
        if self._last_rate is not None:
            current = (1 - self._smooth_factor) * current + self._smooth_factor * self._last_rate
        self._counted += self._pending
        self._pending = 0.0
        self._last_reading = now
        self._last_rate = current
        return current

    def global_rate(self) -> float:
        """Samples per second since the clock (re)started."""
        elapsed = self.elapsed_seconds()
        return self.total_count / elapsed if elapsed > 0 else 0.0
