"""Utilities: data executors, step closures, profiling."""

from cstorch.utils import data, step_closures
from cstorch.utils.data import DataExecutor, DataLoader, RestartableDataLoader
from cstorch.utils.step_closures import checkpoint_closure, step_closure

__all__ = ["DataLoader"]
