"""The data executor's rate profiler (``executor.profiler.rate_tracker``)."""

from __future__ import annotations

import json
import os
import time


class Activity:
    """A thing the profiler measures; subclasses give it a unique ``name()``."""

    @staticmethod
    def name() -> str:
        raise NotImplementedError

    def start(self):
        pass

    def step(self, batch_size):
        pass

    def stop(self):
        pass

    def summary(self) -> dict:
        return {}


class RateTrackerActivity(Activity):
    """Samples per second over the last step (``rate``) and the whole run (``global_rate``)."""

    @staticmethod
    def name() -> str:
        return "rate_tracker"

    def __init__(self):
        self._start = None
        self._last = None
        self._last_rate = None
        self.total_samples = 0
        self._stop = None

    def start(self):
        self._start = self._last = time.perf_counter()

    def step(self, batch_size):
        now = time.perf_counter()
        samples = batch_size or 0
        self.total_samples += samples
        elapsed = now - self._last
        self._last_rate = samples / elapsed if elapsed > 0 else 0.0
        self._last = now

    def stop(self):
        self._stop = time.perf_counter()

    def _require(self, value, what):
        if value is None:
            raise RuntimeError(f"The rate tracker has no {what} yet: run at least one step.")
        return value

    @property
    def total_time(self) -> float:
        start = self._require(self._start, "start time")
        return (self._stop or self._last) - start

    @property
    def rate(self) -> float:
        return self._require(self._last_rate, "rate")

    @property
    def global_rate(self) -> float:
        elapsed = self.total_time
        return self.total_samples / elapsed if elapsed > 0 else 0.0

    samples_per_sec = global_rate

    @property
    def flops_utilization(self):
        return None

    def summary(self) -> dict:
        return {"total_samples": self.total_samples, "total_time": self.total_time,
                "global_rate": self.global_rate}


class Profiler:
    """Runs the activities around an executor's steps and writes ``performance.json``."""

    def __init__(self, outdir, activities=None):
        self.outdir = outdir
        self.activities = {}
        for activity in [RateTrackerActivity] + list(activities or []):
            if not (isinstance(activity, type) and issubclass(activity, Activity)):
                raise TypeError(f"Profiler activities must be Activity subclasses, got "
                                f"{activity!r}.")
            name = activity.name()
            if name in self.activities:
                raise ValueError(f"Two profiler activities are named {name!r}.")
            self.activities[name] = activity()
        self._entered = False

    def __getattr__(self, name):
        activities = self.__dict__.get("activities", {})
        if name in activities:
            return activities[name]
        raise AttributeError(name)

    def __enter__(self):
        self._entered = True
        for activity in self.activities.values():
            activity.start()
        return self

    def step(self, batch_size):
        if not self._entered:
            raise RuntimeError("Profiler.step() was called before the profiler was started.")
        for activity in self.activities.values():
            activity.step(batch_size)

    def __exit__(self, *exc):
        for activity in self.activities.values():
            activity.stop()
        if self.outdir:
            os.makedirs(self.outdir, exist_ok=True)
            summary = {}
            for name, activity in self.activities.items():
                try:
                    summary[name] = activity.summary()
                except RuntimeError:
                    summary[name] = {}
            with open(os.path.join(self.outdir, "performance.json"), "w") as f:
                json.dump(summary, f, indent=2)
        return False
