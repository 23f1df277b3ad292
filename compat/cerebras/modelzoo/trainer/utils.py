"""From a validated ``trainer:`` config to a running Trainer: ``run_trainer(mode, params)``.

Every part of the Trainer is passed as a factory, as the Model Zoo does: the model is built
under the backend's device, the optimizer from the model, the schedulers from the optimizer.
Default callbacks (CheckLoss, LogOptimizerParamGroup("lr"), ComputeNorm, ModelEvalMetrics,
RateProfiler) and loggers (ProgressLogger, TensorBoardLogger) are added unless the config
lists them with a null value (``- CheckLoss: null`` under ``callbacks`` removes it).
"""

from __future__ import annotations

import copy
import os
from typing import List

import torch

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer import callbacks as cb
from cerebras.modelzoo.trainer.config import (
    TrainerConfig,
    TrainerConfigError,
    callback_class,
    validate_trainer_params,
)
from cerebras.modelzoo.trainer.legacy import (
    convert_legacy_params_to_trainer_params,
    is_legacy_params,
)
from cerebras.modelzoo.trainer.registry import get_data_processor, get_model
from cerebras.modelzoo.trainer.trainer import Trainer
from cstorch.backend import get_or_create
from cstorch.errors import quoted
from cstorch.utils.yaml_files import YAMLFileError, load_yaml

DEFAULT_CALLBACKS = {
    "CheckLoss": {},
    "LogOptimizerParamGroup": {"keys": "lr"},
    "ComputeNorm": {},
    "ModelEvalMetrics": {},
    "RateProfiler": {},
}
DEFAULT_LOGGERS = {"ProgressLogger": {}, "TensorBoardLogger": {}}

MODES = {
    "fit": "fit",
    "train": "fit",
    "train_and_eval": "fit",
    "validate": "validate",
    "eval": "validate",
    "validate_all": "validate_all",
    "eval_all": "validate_all",
}


# ------------------------------------------------------------------------------------ data
def _build_input(data_processor: str, fields: dict):
    """The input function of every YAML dataloader: the processor's batches."""
    processor = get_data_processor(data_processor)
    produced = processor(**fields)
    if isinstance(produced, torch.utils.data.DataLoader):
        return produced
    if hasattr(produced, "create_dataloader"):
        return produced.create_dataloader()
    if hasattr(produced, "__iter__"):
        return produced
    raise TypeError(
        f"Data processor {data_processor!r} returned {type(produced).__name__}; it "
        "must return a torch DataLoader, an iterable of batches, or an object with "
        "create_dataloader()."
    )


def create_dataloader(config) -> cstorch.utils.data.DataLoader:
    try:  # a wrong name is a config error, said now rather than when the loader first runs
        get_data_processor(config.data_processor)
    except ValueError as error:
        raise TrainerConfigError(f"data_processor: {error}") from None
    fields = dict(config.model_extra)
    return cstorch.utils.data.DataLoader(_build_input, config.data_processor, fields)


def _dataloaders(configs):
    if configs is None:
        return None
    if isinstance(configs, list):
        return [create_dataloader(c) for c in configs]
    return create_dataloader(configs)


# --------------------------------------------------------------------------------- backend
def _backend(init):
    """The process backend for ``init`` (reused when one of the same type exists)."""
    if init.backend is not None:
        kwargs = dict(init.backend.model_extra)
        backend_type = init.backend.backend_type.upper()
        if init.device is not None and init.device.upper() != backend_type:
            raise TrainerConfigError(
                f"init.device ({init.device}) and "
                f"init.backend.backend_type ({backend_type}) disagree."
            )
        if init.backend.cluster_config is not None:
            if backend_type != "CSX":
                raise TrainerConfigError("init.backend.cluster_config is only for CSX.")
            kwargs["cluster_config"] = cstorch.distributed.ClusterConfig(
                **init.backend.cluster_config
            )
    elif init.device is not None:
        backend_type, kwargs = init.device.upper(), {}
    else:
        raise TrainerConfigError("Set init.device (CPU, GPU or CSX) or init.backend.")
    allowed = set(cstorch.backend.get_backend_args(backend_type)) - {"self", "backend_type"}
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise TrainerConfigError(
            f"Unknown init.backend keys {quoted(unknown)} for {backend_type}; "
            f"accepted: {sorted(allowed)}."
        )
    return get_or_create(
        backend_type,
        mismatch=lambda existing: TrainerConfigError(
            f"This process already runs a {existing.backend_type.name} backend; all trainer "
            f"phases must use one device type (got {backend_type})."
        ),
        **kwargs,
    )


# ------------------------------------------------------------------------ init arguments
def _model_factory(config):
    try:
        cls = get_model(config.name)
    except ValueError as error:
        raise TrainerConfigError(f"init.model.name: {error}") from None
    kwargs = dict(config.model_extra)

    def build_model():
        return cls(**kwargs)

    return build_model


def _optimizer_factory(config):
    if config is None:
        return None
    ((name, kwargs),) = config.items()
    kwargs = dict(kwargs or {})
    cstorch.optim.configure_optimizer_params(name, kwargs)  # unknown names fail now

    def build_optimizer(model):
        return cstorch.optim.configure_optimizer(name, model.parameters(), **kwargs)

    return build_optimizer


def _scheduler_factories(configs):
    factories = []
    for entry in configs or []:
        ((name, kwargs),) = entry.items()
        cls, cls_kwargs = cstorch.optim.configure_scheduler_params(
            {"scheduler": name, **(kwargs or {})}
        )
        factories.append(
            lambda optimizer, cls=cls, cls_kwargs=cls_kwargs: cls(optimizer, **cls_kwargs)
        )
    return factories


def _instances(entries, defaults):
    """Callback or logger objects from YAML entries, defaults first unless nulled."""
    requested = {}
    for entry in entries or []:
        if isinstance(entry, str):
            requested[entry] = {}
        else:
            ((name, kwargs),) = entry.items()
            requested[name] = kwargs  # None removes a default
    merged = {name: kwargs for name, kwargs in defaults.items() if name not in requested}
    merged.update(requested)
    objects = []
    for name, kwargs in merged.items():
        if kwargs is None and name in defaults:
            continue
        cls = callback_class(name)
        try:
            objects.append(cls(**(kwargs or {})))
        except TypeError as error:
            raise TrainerConfigError(
                f"Cannot build {name} from {quoted(kwargs)}: {str(error)[:300]}"
            ) from error
    return objects


def configure_trainer_from_config(config: TrainerConfig) -> Trainer:
    """Builds the Trainer of one validated phase."""
    init = config.init
    defaults = dict(DEFAULT_CALLBACKS)
    if init.optimizer is None:
        defaults.pop("LogOptimizerParamGroup")
    section = lambda value: None if value is None else value.model_dump()  # noqa: E731
    return Trainer(
        backend=_backend(init),
        model_dir=init.model_dir,
        model=_model_factory(init.model),
        optimizer=_optimizer_factory(init.optimizer),
        schedulers=_scheduler_factories(init.schedulers),
        precision=None if init.precision is None else cb.MixedPrecision(**section(init.precision)),
        sparsity=init.sparsity,
        loop=None if init.loop is None else cb.TrainingLoop(**section(init.loop)),
        checkpoint=None if init.checkpoint is None else cb.Checkpoint(**section(init.checkpoint)),
        logging=None if init.logging is None else cb.Logging(**section(init.logging)),
        callbacks=_instances(init.callbacks, defaults),
        loggers=_instances(init.loggers, DEFAULT_LOGGERS),
        seed=init.seed,
        autorestart=None if init.autorestart is None else cb.AutoRestart(**init.autorestart),
    )


# ------------------------------------------------------------------------------------- run
def _ckpt_path(value):
    return ... if value is None else value


def _mode_section(phase, index: int, mode: str):
    """The section of ``phase`` that ``mode`` runs; TrainerConfigError (before any phase is
    built) when it is missing, or when a fit has no optimizer to train with."""
    action = MODES[mode]
    section = {"fit": phase.fit, "validate": phase.validate_, "validate_all": phase.validate_all}[
        action
    ]
    if section is None:
        example = {
            "fit": "fit:\n  train_dataloader: {data_processor: ...}",
            "validate": "validate:\n  val_dataloader: {data_processor: ...}",
            "validate_all": "validate_all:\n  val_dataloaders: {data_processor: ...}",
        }[action]
        raise TrainerConfigError(
            f"Mode {mode!r} needs a `{action}` section in trainer phase {index}, next to "
            f"`init`, e.g.\n{example}"
        )
    if action == "fit" and phase.init.optimizer is None:
        raise TrainerConfigError(
            f"trainer.init.optimizer: mode {mode!r} trains, and trainer phase {index} names no "
            "optimizer; add one, e.g. `optimizer: {SGD: {lr: 0.01}}`."
        )
    return section


def run_trainer(mode: str, params: dict) -> List[Trainer]:
    """Runs every phase of ``params`` in ``mode`` (fit, validate, validate_all, or the legacy
    train, eval, train_and_eval, eval_all). Returns the trainers."""
    if mode not in MODES:
        raise ValueError(f"Unknown mode {mode!r}; expected one of {', '.join(MODES)}.")
    params = copy.deepcopy(params)
    if is_legacy_params(params):
        params = convert_legacy_params_to_trainer_params(params)
    phases = validate_trainer_params(params)
    action = MODES[mode]
    sections = [_mode_section(phase, index, mode) for index, phase in enumerate(phases)]
    trainers = []
    for phase, section in zip(phases, sections):
        trainer = configure_trainer_from_config(phase)
        if action == "fit":
            val = _dataloaders(section.val_dataloader)
            if mode == "train":  # train only: no validation during fit
                trainer.loop.eval_frequency, val = None, None
            trainer.fit(
                create_dataloader(section.train_dataloader),
                val,
                ckpt_path=_ckpt_path(section.ckpt_path),
            )
        elif action == "validate":
            loaders = _dataloaders(section.val_dataloader)
            for loader in loaders if isinstance(loaders, list) else [loaders]:
                trainer.validate(loader, ckpt_path=_ckpt_path(section.ckpt_path))
        else:
            paths = section.ckpt_paths
            if paths is None:
                paths = [str(p) for p in trainer.checkpoint.get_all_checkpoints()]
                if not paths:
                    raise FileNotFoundError(
                        f"validate_all found no checkpoints in "
                        f"{trainer.checkpoint.checkpoint_root}."
                    )
            trainer.validate_all(_dataloaders(section.val_dataloaders), ckpt_paths=paths)
        trainers.append(trainer)
    return trainers


def load_params(path) -> dict:
    """Reads a YAML params file (plain YAML: no Python objects are constructed)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Params file {path} does not exist.")
    with open(path) as f:
        try:
            params = load_yaml(f, path)
        except YAMLFileError as error:
            raise TrainerConfigError(str(error)) from None
    if not isinstance(params, dict):
        raise TrainerConfigError(
            f"{path} must hold a mapping (with a `trainer` key), got {type(params).__name__}."
        )
    return params
