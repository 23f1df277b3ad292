"""Run modes (``cerebras.pytorch.core.modes``), the names releases 2.0 to 2.3 of the Model Zoo
pass between their run flow and the API: which of training and evaluation a run does."""

TRAIN = "train"
EVAL = "eval"
TRAIN_AND_EVAL = "train_and_eval"
EVAL_ALL = "eval_all"
INFERENCE = "inference"


def get_modes():
    """Every valid mode, in a fixed order."""
    return (TRAIN, EVAL, TRAIN_AND_EVAL, EVAL_ALL, INFERENCE)


def is_valid(mode) -> bool:
    return mode in get_modes()
