"""``configure``: sparsity algorithms from a config (a float, a dict or a list of dicts), as
the Model Zoo's YAML ``sparsity:`` section gives them.

Differences from cerebras-pytorch 2.10 (on purpose): an unknown algorithm name raises
ValueError listing the known ones (the reference raised NameError).
"""

from __future__ import annotations

import inspect
import warnings
from copy import deepcopy
from typing import Callable, Dict, List, Union

import torch

from cstorch.errors import quoted
from cstorch.sparse.base import SparsityAlgorithm
from cstorch.sparse.group import Group
from jax_backend.errors import CstorchTypeError, CstorchValueError

SparseParamFilterType = Callable[[str, torch.nn.Parameter], bool]
ParamNamePatternsType = Union[str, List[str], Dict[str, dict]]


def default_sparse_param_filter(name: str, param: torch.nn.Parameter) -> bool:
    """Sparsify parameters with more than one dimension, except embeddings, norms, the LM
    head and positional-embedding helpers."""
    lowered = name.lower()
    if param is None or len(param.shape) <= 1:
        return False
    return not any(word in lowered for word in ("embedding", "norm", "lm_head", "pe_helper"))


def flatten_sparsity_params(kwargs):
    """Unrolls a config-class style ``{"groups": ..., "params": {...}}`` into plain dicts."""
    if isinstance(kwargs, (int, float, list, tuple)) or not isinstance(kwargs, dict):
        return kwargs
    if "groups" not in kwargs:
        return kwargs
    groups = kwargs.get("groups", {})

    def unroll(entry):
        flat = dict(entry)
        flat.update(flat.pop("params", {}) or {})
        return flat

    if isinstance(groups, dict):
        groups = dict(groups)
        groups.pop("groups", None)
        return unroll(groups)
    if isinstance(groups, list):
        return [unroll(g) for g in groups]
    return groups


def _algorithms() -> dict:
    classes, pending = {}, list(SparsityAlgorithm.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if not inspect.isabstract(cls) and not issubclass(cls, Group):
            classes[cls.__name__.lower()] = cls
    return classes


def map_sparsity_algorithm(algorithm: str):
    """The sparsity algorithm class named ``algorithm`` (case-insensitive)."""
    known = _algorithms()
    cls = known.get(str(algorithm).lower())
    if cls is None:
        name = algorithm if len(str(algorithm)) <= 60 else quoted(str(algorithm))
        raise CstorchValueError(
            f"Unsupported sparsity algorithm: {name}. Supported types: {sorted(known)}"
        )
    return cls


def _accepted_arguments(cls) -> set:
    """The keyword arguments ``cls(...)`` takes: its constructor's, and its bases' while each
    passes ``**kwargs`` on."""
    names = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        parameters = list(inspect.signature(vars(klass)["__init__"]).parameters.values())[1:]
        names.update(
            p.name
            for p in parameters
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        )
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            break
    return names


def check_config(config: Union[float, dict, List[dict]]) -> None:
    """Raises ValueError or TypeError for a config ``configure`` would refuse (an unknown
    algorithm or argument, a sparsity level, schedule, update or init method its algorithm
    refuses, a wrong ``param_filter``), building nothing: no backend is needed, so a YAML
    ``sparsity:`` section is checked before anything of the run exists."""
    config = flatten_sparsity_params(config)
    if isinstance(config, bool):
        raise CstorchTypeError(f"A sparsity config cannot be a bool, got {config!r}.")
    if isinstance(config, (int, float)):
        return check_config({"sparsity": config})
    if isinstance(config, (list, tuple)):
        for item in config:
            check_config(item)
        return None
    if not isinstance(config, dict):
        raise CstorchTypeError(
            f"A sparsity config is a float, a dict or a list of dicts, got {type(config)}."
        )
    config = dict(config)
    if "algorithm" not in config and "type" in config:
        config["algorithm"] = config.pop("type")  # (configure warns that the name is old)
    sparsity_cls = map_sparsity_algorithm(config.pop("algorithm", "static"))
    param_filter = config.pop("param_filter", None)
    if param_filter is not None and not (
        isinstance(param_filter, str)
        or (
            isinstance(param_filter, (list, tuple))
            and all(isinstance(p, str) for p in param_filter)
        )
    ):
        raise CstorchTypeError(
            f"filter must be a string or list of strings, got {type(param_filter)}"
        )
    if "schedule" in config:
        if "sparsity" in config:
            raise CstorchValueError(
                "Cannot specify both 'sparsity' and 'schedule' in the same config"
            )
        config["sparsity"] = config.pop("schedule")
    if config.get("sparsity") is None:
        return None
    unknown = sorted(set(config) - _accepted_arguments(sparsity_cls))
    if unknown:
        raise CstorchValueError(
            f"Invalid sparsity config for {sparsity_cls.__name__}: unknown "
            f"argument{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(quoted(k) for k in unknown[:5])}; accepted: "
            f"{', '.join(sorted(_accepted_arguments(sparsity_cls)))}"
        )
    try:
        sparsity_cls.check_arguments(**config)
    except (TypeError, ValueError) as err:
        raise CstorchValueError(
            f"Invalid sparsity config for {sparsity_cls.__name__}: {str(err)[:300]}"
        ) from None
    return None


def configure(config: Union[float, dict, List[dict]]) -> Group:
    """A ``Group`` from a sparsity config.

    * a float ``s``: static sparsity ``s`` on the default parameters
      (``default_sparse_param_filter``);
    * a dict: ``algorithm`` (default ``"static"``; ``type`` is a deprecated alias),
      ``param_filter`` (glob pattern(s); default: the default filter), ``sparsity`` (or its
      alias ``schedule``) and the algorithm's other arguments;
    * a list of dicts: one group per entry (the first matching entry wins).

    The config is checked whole first (``check_config``), so a mistake anywhere in it is
    refused before any algorithm is built.
    """
    check_config(config)
    config = flatten_sparsity_params(config)
    if isinstance(config, bool):
        raise CstorchTypeError(f"A sparsity config cannot be a bool, got {config!r}.")
    if isinstance(config, (int, float)):
        return configure({"sparsity": config})
    if isinstance(config, (list, tuple)):
        sparsity = Group()
        for item in config:
            configured = configure(item)
            if configured is not None:
                sparsity.extend(configured)
        return sparsity
    if not isinstance(config, dict):
        raise CstorchTypeError(
            f"A sparsity config is a float, a dict or a list of dicts, got {type(config)}."
        )
    config = deepcopy(config)
    if "algorithm" not in config and "type" in config:
        warnings.warn("The 'type' key is deprecated, please use 'algorithm' instead")
        config["algorithm"] = config.pop("type")
    sparsity_cls = map_sparsity_algorithm(config.pop("algorithm", "static"))
    param_filter = config.pop("param_filter", None)
    if "schedule" in config:
        if "sparsity" in config:
            raise CstorchValueError(
                "Cannot specify both 'sparsity' and 'schedule' in the same config"
            )
        config["sparsity"] = config.pop("schedule")
    if config.get("sparsity") is None:
        return None
    try:
        sparsity = sparsity_cls(**config)
    except TypeError as err:
        raise CstorchValueError(
            f"Invalid sparsity config for {sparsity_cls.__name__}: {err}"
        ) from None
    group = Group()
    if param_filter is None:
        group.add(default_sparse_param_filter, sparsity)
    elif isinstance(param_filter, (list, tuple, str)):
        group.add(param_filter, sparsity)
    else:
        raise CstorchTypeError(
            f"filter must be a string or list of strings, got {type(param_filter)}"
        )
    return group
