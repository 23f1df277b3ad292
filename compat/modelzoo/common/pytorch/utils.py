"""Helpers that Model Zoo 1.x model and data code imports from
``modelzoo.common.pytorch.utils``: synthetic data (``SampleGenerator``), input dtypes,
parameter grouping, structure traversal, logging set-up, checkpoint discovery, and the
runconfig validator."""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any, Callable, Generator, List, Optional, Tuple

import torch

from cstorch.utils.checkpoint_files import find_checkpoints
from modelzoo.common.pytorch.schema import validate_runconfig
from modelzoo.common.run_utils.cli_parser import (  # noqa: F401  (1.6/1.7 lived here)
    get_legacy_parser as get_parser,
    get_params,
    get_params_from_args,
    read_params_file,
)


def get_input_dtype(to_float16: bool) -> torch.dtype:
    """The input dtype: the half dtype when ``to_float16`` and the run can use it (on the
    modeled wafer or a GPU), else float32 (as 1.x did for vanilla CPU runs)."""
    from modelzoo.common.pytorch import cb_model as cm
    from modelzoo.common.pytorch.half_dtype import half_dtype_instance

    if to_float16 and not cm.use_cs() and not torch.cuda.is_available():
        print(
            "to_float16 == True for input dtype is not supported with vanilla PyTorch CPU "
            "workflow. Setting to_float16 to False."
        )
        to_float16 = False
    return half_dtype_instance.half_dtype if to_float16 else torch.float32


def visit_structure(
    data_structure,
    select_fn: Callable[[Any], bool],
    strict: bool = False,
    scope: Optional[List[str]] = None,
) -> Generator[Tuple[List[str], Any], None, None]:
    """Yields ``(scope, item)`` for each item of a nested list/tuple/dict that ``select_fn``
    accepts; with ``strict``, any other leaf is a ValueError."""
    scope = scope or []
    if isinstance(data_structure, (list, tuple)):
        for i, value in enumerate(data_structure):
            yield from visit_structure(value, select_fn, strict, scope + [str(i)])
    elif isinstance(data_structure, dict):
        for key, value in data_structure.items():
            yield from visit_structure(value, select_fn, strict, scope + [str(key)])
    elif select_fn(data_structure):
        yield scope, data_structure
    elif strict:
        raise ValueError(f"Unknown data structure: {data_structure!r}")


def to_cpu(tensor):
    from modelzoo.common.pytorch import cb_model

    return cb_model.to_cpu(tensor)


_NORM_MODULES = (
    torch.nn.LayerNorm,
    torch.nn.GroupNorm,
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.modules.instancenorm._InstanceNorm,
)


def trainable_named_parameters(model: torch.nn.Module):
    """``(no_decay_layers, named_parameters)``: normalization layers and biases get no
    weight decay."""
    no_decay = [name for name, module in model.named_modules() if isinstance(module, _NORM_MODULES)]
    no_decay.append("bias")
    return no_decay, list(model.named_parameters())


def group_optimizer_params(trainable_params, no_decay_layers, weight_decay_rate):
    """Two parameter groups: with ``weight_decay_rate``, and without weight decay."""

    def decays(name):
        return not any(layer in name for layer in no_decay_layers)

    return [
        {
            "params": [p for n, p in trainable_params if decays(n)],
            "weight_decay": weight_decay_rate,
        },
        {"params": [p for n, p in trainable_params if not decays(n)], "weight_decay": 0.0},
    ]


class SampleGenerator:
    """Yields ``data`` ``sample_count`` times (synthetic input in place of a DataLoader)."""

    def __init__(self, data, sample_count: int):
        self._data = data
        self._sample_count = sample_count
        self._count = 0

    def __iter__(self):
        return SampleGenerator(self._data, self._sample_count)

    def __len__(self):
        return self._sample_count

    def __next__(self):
        return self.next()

    def next(self):
        if self._count >= self._sample_count:
            raise StopIteration
        self._count += 1
        return self._data


class RunConfigParamsValidator:
    """Validates a ``runconfig`` section (see ``modelzoo.common.pytorch.schema``)."""

    def validate(self, config: dict) -> None:
        validate_runconfig(config)


CHECKPOINT_NAME = re.compile(r"checkpoint_(?P<step>\d+)\.mdl")


def get_checkpoints(model_dir: str) -> List[str]:
    """The ``checkpoint_<step>.mdl`` files in ``model_dir``, by increasing step."""
    return [str(path) for path in find_checkpoints(model_dir, CHECKPOINT_NAME)]


def setup_logging(
    chief_logging_level: str = None, streamer_logging_level: str = None, logging_dir: str = None
) -> None:
    """Logs at ``chief_logging_level`` (default INFO) to stdout, and to
    ``<logging_dir>/run.log`` when a directory is given."""
    level = (chief_logging_level or "INFO").upper()
    if level not in logging.getLevelNamesMapping():
        raise ValueError(
            f"Invalid logging level {chief_logging_level!r}; use one of "
            "DEBUG, INFO, WARNING, ERROR, CRITICAL."
        )
    handlers = [logging.StreamHandler(sys.stdout)]
    if logging_dir:
        os.makedirs(logging_dir, exist_ok=True)
        handlers.append(logging.FileHandler(os.path.join(logging_dir, "run.log")))
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s:  %(message)s", handlers=handlers, force=True
    )
