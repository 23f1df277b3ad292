"""The CSX op profiler (see ``profiler.profile``)."""

from cstorch.profiler.profiler import ProfilerRegistry, profile, schedule, tensorboard_trace_handler

__all__ = ["ProfilerRegistry", "profile", "schedule", "tensorboard_trace_handler"]
