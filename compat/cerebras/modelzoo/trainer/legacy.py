"""Legacy (pre-2.3) params files -> the ``trainer:`` config.

A legacy file has top-level ``runconfig``, ``model``, ``optimizer``, ``train_input`` and
``eval_input`` sections. Their keys move to the Trainer sections as the Model Zoo's converter
moves them; the model is named by ``model.name`` (or ``runconfig.model_name``), since legacy
files left that to the script that read them.
"""

from __future__ import annotations

import copy

from cstorch.errors import quoted

_LOOP_KEYS = (
    "num_steps",
    "max_steps",
    "num_epochs",
    "steps_per_epoch",
    "eval_frequency",
    "eval_steps",
)
_CHECKPOINT_KEYS = {
    "checkpoint_steps": "steps",
    "disable_strict_checkpoint_loading": "disable_strict_checkpoint_loading",
    "autoload_last_checkpoint": "autoload_last_checkpoint",
    "save_initial_checkpoint": "save_initial_checkpoint",
}
_PRECISION_FROM_OPTIMIZER = (
    "loss_scaling_factor",
    "initial_loss_scale",
    "steps_per_increase",
    "min_loss_scale",
    "max_loss_scale",
    "max_gradient_norm",
    "max_gradient_value",
)
_RUNCONFIG_IGNORED = (
    "mode",
    "compile_only",
    "validate_only",
    "experimental_api",
    "use_cstorch_optimizer_step",
    "save_losses",
    "enable_summaries",
    "num_workers_per_csx",
    "num_wgt_servers",
    "num_act_servers",
    "mgmt_address",
    "mount_dirs",
    "python_paths",
    "job_labels",
    "credentials_path",
    "transfer_processes",
    "execution_strategy",
    "use_cs_grad_accum",
    "save_summary_steps",
    "num_csx",
)


def is_legacy_params(params) -> bool:
    return (
        isinstance(params, dict)
        and "trainer" not in params
        and ("runconfig" in params or "train_input" in params or "eval_input" in params)
    )


def _scheduler_entries(learning_rate):
    """``optimizer.learning_rate`` (a number, a scheduler dict or a list of them)."""
    if isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool):
        return [{"ConstantLR": {"learning_rate": float(learning_rate)}}]
    entries = learning_rate if isinstance(learning_rate, list) else [learning_rate]
    schedulers = []
    for entry in entries:
        if not isinstance(entry, dict) or "scheduler" not in entry:
            raise ValueError(
                f"optimizer.learning_rate entries need a `scheduler` key, got {quoted(entry)}."
            )
        entry = dict(entry)
        name = str(entry.pop("scheduler"))
        schedulers.append({name if name.endswith("LR") else f"{name}LR": entry})
    return schedulers


def convert_legacy_params_to_trainer_params(params: dict) -> dict:
    """The ``{"trainer": {...}}`` equivalent of a legacy params dict."""
    params = copy.deepcopy(params)
    runconfig = dict(params.pop("runconfig", {}) or {})
    model = dict(params.pop("model", {}) or {})
    optimizer = dict(params.pop("optimizer", {}) or {})
    train_input = params.pop("train_input", None)
    eval_input = params.pop("eval_input", None)
    params.pop("sparsity", None)
    if params:
        raise ValueError(f"Unknown top-level sections {quoted(sorted(params))} in legacy params.")

    init = {"model_dir": runconfig.pop("model_dir", "./model_dir")}
    if "seed" in runconfig:
        init["seed"] = runconfig.pop("seed")
    init["backend"] = {"backend_type": str(runconfig.pop("target_device", "CPU")).upper()}

    name = model.pop("name", None) or runconfig.pop("model_name", None)
    if name is None:
        raise ValueError(
            "Legacy params do not name the model: add model.name (a registered "
            "model or an import path such as my_package.models:MyModel)."
        )
    precision = {}
    if "mixed_precision" in model:
        precision["enabled"] = bool(model.pop("mixed_precision"))
    if "fp16_type" in model:
        precision["fp16_type"] = model.pop("fp16_type")
    model.pop("use_bfloat16", None)
    init["model"] = {"name": name, **model}

    loop = {key: runconfig.pop(key) for key in _LOOP_KEYS if key in runconfig}
    if "grad_accum_steps" in optimizer:
        loop["grad_accum_steps"] = optimizer.pop("grad_accum_steps")
    for key in _PRECISION_FROM_OPTIMIZER:
        if key in optimizer:
            precision[key] = optimizer.pop(key)
    if "precision_opt_level" in runconfig:
        precision["precision_opt_level"] = runconfig.pop("precision_opt_level")
    optimizer.pop("log_summaries", None)
    if optimizer:
        optimizer_type = optimizer.pop("optimizer_type", None)
        if optimizer_type is None:
            raise ValueError("Legacy optimizer section has no optimizer_type.")
        if "learning_rate" in optimizer:
            init["schedulers"] = _scheduler_entries(optimizer.pop("learning_rate"))
        init["optimizer"] = {optimizer_type: optimizer}
    if precision:
        init["precision"] = precision
    if loop:
        init["loop"] = loop
    checkpoint = {
        new: runconfig.pop(old) for old, new in _CHECKPOINT_KEYS.items() if old in runconfig
    }
    if checkpoint:
        init["checkpoint"] = checkpoint
    logging = {}
    if "log_steps" in runconfig:
        logging["log_steps"] = runconfig.pop("log_steps")
    if "logging" in runconfig:
        logging["log_level"] = runconfig.pop("logging")
    if logging:
        init["logging"] = logging
    callbacks = []
    keep = runconfig.pop("keep_checkpoint_max", runconfig.pop("max_checkpoints", None))
    if keep:
        callbacks.append({"KeepNCheckpoints": {"n": keep}})
    if runconfig.pop("check_loss_values", True) is False:
        callbacks.append({"CheckLoss": None})
    if callbacks:
        init["callbacks"] = callbacks
    checkpoint_path = runconfig.pop("checkpoint_path", None)
    for key in _RUNCONFIG_IGNORED:
        runconfig.pop(key, None)
    if runconfig:
        raise ValueError(
            f"Legacy runconfig keys {sorted(runconfig)} have no Trainer "
            "equivalent here; remove them or move them into the trainer config."
        )

    trainer = {"init": init}
    loader = lambda section: dict(section)  # noqa: E731  (data_processor + its fields)
    if train_input is not None:
        trainer["fit"] = {"train_dataloader": loader(train_input)}
        if eval_input is not None:
            trainer["fit"]["val_dataloader"] = loader(eval_input)
        if checkpoint_path:
            trainer["fit"]["ckpt_path"] = checkpoint_path
    if eval_input is not None:
        trainer["validate"] = {"val_dataloader": loader(eval_input)}
        trainer["validate_all"] = {"val_dataloaders": loader(eval_input)}
        if checkpoint_path:
            trainer["validate"]["ckpt_path"] = checkpoint_path
            trainer["validate_all"]["ckpt_paths"] = [checkpoint_path]
    return {"trainer": trainer}
