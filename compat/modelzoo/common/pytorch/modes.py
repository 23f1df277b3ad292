"""Run modes of the 1.x runners."""

TRAIN = "train"
EVAL = "eval"
TRAIN_AND_EVAL = "train_and_eval"
EVAL_ALL = "eval_all"
INFERENCE = "inference"


def get_modes():
    return (TRAIN, EVAL, TRAIN_AND_EVAL, INFERENCE, EVAL_ALL)


def is_valid(mode) -> bool:
    return mode in get_modes()
