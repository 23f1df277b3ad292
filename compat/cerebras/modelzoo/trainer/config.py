"""The ``trainer:`` YAML schema, validated with pydantic before anything is built.

A config is ``{"trainer": {...}}`` or ``{"trainer": [{...}, ...]}`` (phases run in order),
each with the sections ``init`` (the Trainer's arguments) and any of ``fit``, ``validate``,
``validate_all``. Unknown keys, unknown callbacks or loggers and malformed optimizer or
scheduler entries are reported together, each with its location in the file. Every
argument is checked against the signature it goes to (model, data processor, optimizer,
scheduler, callback), and every import path against the kind its key names
(``registry``), so a typo or a config naming ``os:system`` is refused before anything is
built or called.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Literal, Optional, Union

try:  # optional: only the YAML path needs it; the Trainer's Python API does not
    import pydantic
except ImportError as error:
    raise ImportError(
        "Validating a `trainer:` YAML config needs the pydantic package (>= 2), which is not "
        "installed: `pip install 'pydantic>=2'`. The Trainer's Python API "
        "(`from cerebras.modelzoo.trainer import Trainer`) works without it.",
        name="pydantic",
    ) from error
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    field_validator,
    model_validator,
)

from cerebras.modelzoo.trainer import callbacks as _callbacks, loggers as _loggers
from cerebras.modelzoo.trainer.callbacks.checkpoint import checkpoint_name_parts
from cerebras.modelzoo.trainer.callbacks.reproducibility import check_seed
from cerebras.modelzoo.trainer.registry import (
    check_arguments,
    get_data_processor,
    get_model,
    import_object,
    shown,
)
from cstorch.errors import CstorchError, quoted
from cstorch.optim.config import (  # the old parameter names, which have their own errors
    _OPTIMIZER_ALIASES as OPTIMIZER_ALIASES,
    _SCHEDULER_ALIASES as SCHEDULER_ALIASES,
)
from cstorch.sparse.configure import check_config


class TrainerConfigError(CstorchError, ValueError):
    """The trainer config is invalid; the message lists every problem with its location."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    """A section whose extra keys are arguments of user code (checked against its
    signature by the section's validator)."""

    model_config = ConfigDict(extra="allow")


class LoopConfig(_Strict):
    num_steps: Optional[PositiveInt] = None
    max_steps: Optional[PositiveInt] = None
    num_epochs: Optional[PositiveInt] = None
    steps_per_epoch: Optional[PositiveInt] = None
    eval_frequency: Union[NonNegativeInt, float, None] = 1.0
    eval_steps: Optional[PositiveInt] = None
    grad_accum_steps: PositiveInt = 1


class CheckpointConfig(_Strict):
    steps: Optional[NonNegativeInt] = None
    autoload_last_checkpoint: bool = True
    disable_strict_checkpoint_loading: bool = False
    save_initial_checkpoint: bool = False
    checkpoint_root: Optional[str] = None
    checkpoint_name: str = "checkpoint_{step}.mdl"
    strict_version: bool = True

    @field_validator("checkpoint_name")
    @classmethod
    def _a_checkpoint_name(cls, value):
        checkpoint_name_parts(value)  # one {step} field that reads back from the file name
        return value


class LoggingConfig(_Strict):
    log_steps: NonNegativeInt = 1
    log_level: str = "INFO"
    wsc_log_level: Any = None
    enable_act_frequency: bool = False


class PrecisionConfig(_Strict):
    enabled: bool = True
    fp16_type: Literal["float16", "bfloat16", "cbfloat16"] = "bfloat16"
    precision_opt_level: Optional[Literal[0, 1, 2]] = None
    loss_scaling_factor: Union[float, Literal["dynamic"]] = 1.0
    initial_loss_scale: Optional[float] = None
    steps_per_increase: PositiveInt = 2000
    min_loss_scale: Optional[float] = None
    max_loss_scale: Optional[float] = None
    max_gradient_norm: Optional[float] = None
    max_gradient_value: Optional[float] = None
    log_loss_scale: Optional[bool] = None


class BackendConfig(_Open):
    backend_type: Literal["CSX", "CPU", "GPU", "csx", "cpu", "gpu"]
    cluster_config: Optional[Dict[str, Any]] = None


class ModelConfig(_Open):
    name: str = Field(description="a registered model name or an import path")

    @field_validator("name")
    @classmethod
    def _a_model(cls, value):
        get_model(value)  # a Module subclass (or registered); nothing is called
        return value

    @model_validator(mode="after")
    def _model_arguments(self):
        target = get_model(self.name)
        check_arguments(target, self.model_extra, _display_name(target, self.name))
        return self


class DataLoaderConfig(_Open):
    data_processor: str = Field(description="a registered data processor or an import path")

    @field_validator("data_processor")
    @classmethod
    def _a_data_processor(cls, value):
        get_data_processor(value)
        return value

    @model_validator(mode="after")
    def _data_processor_arguments(self):
        target = get_data_processor(self.data_processor)
        check_arguments(target, self.model_extra, _display_name(target, self.data_processor))
        return self


def _display_name(target, name: str) -> str:
    return getattr(target, "__name__", None) or name


def _single_key(entry, what):
    if not isinstance(entry, dict) or len(entry) != 1:
        raise ValueError(
            f"each {what} must be a dict with exactly one key (its class name), "
            f"e.g. {{SGD: {{lr: 0.1}}}}; got {quoted(entry)}"
        )
    ((name, kwargs),) = entry.items()
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(
            f"the arguments of {what} {quoted(name)} must be a mapping, got {quoted(kwargs)}"
        )
    return name, kwargs or {}


def _user_callback_classes(module, base) -> dict:
    return {
        name: obj
        for name, obj in vars(module).items()
        if isinstance(obj, type)
        and issubclass(obj, base)
        and obj is not base
        and not inspect.isabstract(obj)
        and not issubclass(obj, _callbacks.CoreCallback)
    }


def callback_class(name: str):
    """A callback or logger class by its name in the trainer's modules, or an import path."""
    known = {
        **_user_callback_classes(_callbacks, _callbacks.Callback),
        **_user_callback_classes(_loggers, _loggers.Logger),
    }
    if name in known:
        return known[name]
    if hasattr(_callbacks, name) and issubclass(getattr(_callbacks, name), _callbacks.CoreCallback):
        raise ValueError(
            f"{name} is a core callback; configure it in its own init section "
            "(loop, checkpoint, logging, precision) instead of callbacks"
        )
    if ":" in name or "." in name:
        obj = import_object(name)  # (checked before anything is called)
        if isinstance(obj, type) and issubclass(obj, _callbacks.Callback):
            return obj
        raise ValueError(
            f"{quoted(name)} is not a Callback class; a config may only name "
            "Callback or Logger classes here"
        )
    raise ValueError(
        f"unknown callback or logger {quoted(name)}; known: {', '.join(sorted(known))} "
        "(or give an import path, package.module:MyCallback)"
    )


def _check_callback_entries(entries, what):
    for entry in entries or []:
        name, kwargs = (entry, {}) if isinstance(entry, str) else _single_key(entry, what)
        cls = callback_class(name)
        check_arguments(cls, kwargs, name)  # (a null entry removes a default: no arguments)
    return entries


def _expects_number(parameter: inspect.Parameter) -> bool:
    """Whether a constructor parameter takes a number (by its annotation or its default)."""
    default = parameter.default
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return True
    annotation = parameter.annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return text in ("float", "int")


def _check_numbers(cls, kwargs: dict, label: str) -> None:
    """A string where the constructor takes a number (``lr: "fast"``) is reported here, by
    its key, instead of failing deep inside the constructor."""
    parameters = inspect.signature(cls.__init__).parameters
    for key, value in kwargs.items():
        parameter = parameters.get(key)
        if parameter is None or not isinstance(value, str) or not _expects_number(parameter):
            continue
        try:
            float(value)
            hint = " (YAML reads a number without a dot, such as 1e-3, as a string: write 1.0e-3)"
        except ValueError:
            hint = ""
        raise ValueError(
            f"{shown(label)}.{key} must be a number, got the string {quoted(value)}{hint}"
        )


def _check_optimizer_arguments(name, kwargs: dict) -> None:
    import cerebras.pytorch as cstorch

    learning_rate = kwargs.get("learning_rate")
    if isinstance(learning_rate, str):
        try:
            float(learning_rate)
        except ValueError:
            raise ValueError(
                f"{shown(name)}.learning_rate must be a number, got the string "
                f"{quoted(learning_rate)}"
            ) from None
    try:
        optimizer_cls, _ = cstorch.optim.configure_optimizer_params(name, {})
    except ValueError as error:
        raise ValueError(f"{shown(name)}: {error}") from None
    # An unknown argument is an error here, not the warning configure_optimizer logs (a typo
    # such as lrr would train with the default learning rate). Old names are left to
    # configure_optimizer_params, which says what replaced them.
    check_arguments(
        optimizer_cls,
        kwargs,
        name,
        passed=("params",),
        required=False,
        also=("learning_rate",),
        ignore=_old_names(OPTIMIZER_ALIASES),
    )
    try:
        cstorch.optim.configure_optimizer_params(name, kwargs)
    except ValueError as error:
        raise ValueError(f"{shown(name)}: {error}") from None
    _check_numbers(optimizer_cls, kwargs, name)


def _old_names(aliases: dict) -> list:
    return [old for olds in aliases.values() for old in olds]


def _check_scheduler_arguments(name, kwargs: dict) -> None:
    import cerebras.pytorch as cstorch

    scheduler_cls = _scheduler_class(name)
    if scheduler_cls is not None:  # (old names, lower-cased ones too, get their own message)
        old = {
            *_old_names(SCHEDULER_ALIASES),
            *(p.lower() for p in inspect.signature(scheduler_cls).parameters),
        }
        check_arguments(
            scheduler_cls, kwargs, name, passed=("optimizer",), required=False, ignore=old
        )
    try:
        scheduler_cls, _ = cstorch.optim.configure_scheduler_params({"scheduler": name, **kwargs})
    except ValueError as error:
        raise ValueError(f"{shown(name)}: {error}") from None
    _check_numbers(scheduler_cls, kwargs, name)
    check_arguments(scheduler_cls, kwargs, name, passed=("optimizer",))


def _scheduler_class(name):
    import cerebras.pytorch as cstorch

    try:
        return cstorch.optim.configure_scheduler_params({"scheduler": name})[0]
    except ValueError:
        return None  # an unknown name: reported with the others below


class InitConfig(_Strict):
    device: Optional[Literal["CSX", "CPU", "GPU", "csx", "cpu", "gpu"]] = None
    backend: Optional[BackendConfig] = None
    model_dir: str = "./model_dir"
    seed: Optional[int] = None
    model: ModelConfig
    optimizer: Optional[Dict[str, Optional[Dict[str, Any]]]] = None
    schedulers: Optional[List[Dict[str, Optional[Dict[str, Any]]]]] = None
    precision: Optional[PrecisionConfig] = None
    sparsity: Optional[Any] = None
    loop: Optional[LoopConfig] = None
    checkpoint: Optional[CheckpointConfig] = None
    logging: Optional[LoggingConfig] = None
    callbacks: Optional[List[Union[str, Dict[str, Optional[Dict[str, Any]]]]]] = None
    loggers: Optional[List[Union[str, Dict[str, Optional[Dict[str, Any]]]]]] = None
    autorestart: Optional[Dict[str, Any]] = None

    @field_validator("seed")
    @classmethod
    def _seed_in_range(cls, value):
        try:
            check_seed(value)
        except ValueError as error:
            raise ValueError(str(error).removeprefix("seed: ")) from None
        return value

    @field_validator("sparsity")
    @classmethod
    def _a_sparsity_config(cls, value):
        if value is not None:
            check_config(value)  # the algorithm, its arguments and their values; builds nothing
        return value

    @field_validator("autorestart")
    @classmethod
    def _autorestart_arguments(cls, value):
        if value is not None:
            check_arguments(_callbacks.AutoRestart, value, "AutoRestart")
        return value

    @field_validator("optimizer")
    @classmethod
    def _one_optimizer(cls, value):
        if value is not None:
            name, kwargs = _single_key(value, "optimizer")
            _check_optimizer_arguments(name, kwargs)
        return value

    @field_validator("schedulers", mode="before")
    @classmethod
    def _scheduler_list(cls, value):
        if isinstance(value, dict):
            value = [value]
        for entry in value or []:
            name, kwargs = _single_key(entry, "scheduler")
            _check_scheduler_arguments(name, kwargs)
        return value

    @field_validator("callbacks")
    @classmethod
    def _known_callbacks(cls, value):
        return _check_callback_entries(value, "callback")

    @field_validator("loggers")
    @classmethod
    def _known_loggers(cls, value):
        for entry in value or []:
            name = entry if isinstance(entry, str) else _single_key(entry, "logger")[0]
            if not issubclass(callback_class(name), _loggers.Logger):
                raise ValueError(f"{name} is not a Logger; list it under callbacks")
        return value


_Loaders = Union[DataLoaderConfig, List[DataLoaderConfig]]


class FitConfig(_Strict):
    train_dataloader: DataLoaderConfig
    val_dataloader: Optional[_Loaders] = None
    ckpt_path: Optional[str] = None


class ValidateConfig(_Strict):
    val_dataloader: _Loaders
    ckpt_path: Optional[str] = None


class ValidateAllConfig(_Strict):
    val_dataloaders: Optional[_Loaders] = None
    ckpt_paths: Union[str, List[str], None] = None


class TrainerConfig(_Strict):
    init: InitConfig
    fit: Optional[FitConfig] = None
    validate_: Optional[ValidateConfig] = Field(None, alias="validate")  # (BaseModel.validate)
    validate_all: Optional[ValidateAllConfig] = None


_SHAPE_ERRORS = {"list_type", "dict_type", "model_type", "model_attributes_type"}


def _describe(error: pydantic.ValidationError, prefix: str) -> str:
    """One line per problem: ``trainer.init.x.y: message``. For a section that may be one
    mapping or a list of them, only the errors of the shape that was given are kept (pydantic
    reports both, under labels such as ``list[...]``)."""
    items = []
    for item in error.errors():
        loc = [
            shown(str(part)) for part in item["loc"] if "[" not in str(part)
        ]  # (union labels; keys from the file, shown short)
        items.append((".".join((prefix, *loc)), item))
    lines = []
    for where, item in items:
        if item["type"] in _SHAPE_ERRORS and any(
            other is not item and (w == where or w.startswith(where + ".")) for w, other in items
        ):
            continue
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check its spelling and the section it is in)"
        lines.append(f"  {where}: {message}")
    return "\n".join(dict.fromkeys(lines))


def validate_trainer_params(params) -> List[TrainerConfig]:
    """The validated phases of a ``{"trainer": ...}`` config (TrainerConfigError if invalid)."""
    if not isinstance(params, dict) or "trainer" not in params:
        raise TrainerConfigError(
            "A trainer config is a mapping with a top-level `trainer` key "
            "(convert legacy params with "
            "convert_legacy_params_to_trainer_params)."
        )
    extra = sorted(set(params) - {"trainer"})
    if extra:
        raise TrainerConfigError(
            f"Unknown top-level keys {quoted(extra)}: everything goes under `trainer`."
        )
    phases = params["trainer"]
    single = isinstance(phases, dict)
    phases = [phases] if single else phases
    if not isinstance(phases, list) or not phases:
        raise TrainerConfigError("`trainer` must be a mapping or a non-empty list of them.")
    validated, problems = [], []
    for index, phase in enumerate(phases):
        prefix = "trainer" if single else f"trainer[{index}]"
        try:
            validated.append(TrainerConfig.model_validate(phase))
        except pydantic.ValidationError as error:
            problems.append(_describe(error, prefix))
    if problems:
        lines = "\n".join(problems).splitlines()
        if len(lines) == 1:  # one problem: one line, naming its key
            raise TrainerConfigError(f"Invalid trainer config: {lines[0].strip()}")
        raise TrainerConfigError("Invalid trainer config:\n" + "\n".join(lines))
    return validated
