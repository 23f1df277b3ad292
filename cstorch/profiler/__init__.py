"""The CSX op profiler (see ``profiler.profile``)."""

from cstorch.profiler.profiler import ProfilerRegistry
from cstorch.profiler.profiler import profile
from cstorch.profiler.profiler import schedule
from cstorch.profiler.profiler import tensorboard_trace_handler

__all__ = ["ProfilerRegistry", "profile", "schedule", "tensorboard_trace_handler"]
