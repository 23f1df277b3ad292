"""Run modes of the 1.x runners: cstorch's (``cerebras.pytorch.core.modes``), listed in
the 1.x order."""

from cstorch.core.modes import EVAL, EVAL_ALL, INFERENCE, TRAIN, TRAIN_AND_EVAL, is_valid  # noqa: F401


def get_modes():
    return (TRAIN, EVAL, TRAIN_AND_EVAL, INFERENCE, EVAL_ALL)
