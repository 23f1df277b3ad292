"""The ``runconfig:`` section of a Model Zoo 1.x params file: its keys and their types.

``validate_runconfig`` is what 1.8's ``RunConfigParamsValidator`` enforced with a JSON
schema that allowed no extra properties: an unknown key, or a value of the wrong type, is an
error naming the key (and, for unknown keys, the valid ones). Keys of the 1.6/1.7 command
line (``cs_ip``, ``cpu``, ``appliance``, ...) are accepted too.
"""

from __future__ import annotations

_STR, _INT, _BOOL, _LIST, _NULL, _NUM = "string", "integer", "boolean", "array", "null", "number"

RUNCONFIG_TYPES = {
    # what to run, and where
    "mode": (_STR,),
    "target_device": (_STR,),
    "execution_strategy": (_STR, _NULL),
    "model_dir": (_STR,),
    "service_dir": (_STR,),
    "compile_dir": (_STR, _NULL),
    "compile_only": (_BOOL, _NULL),
    "validate_only": (_BOOL, _NULL),
    "experimental_api": (_BOOL, _NULL),
    "seed": (_INT,),
    "logging": (_STR, _NULL),
    # how long
    "max_steps": (_INT, _NULL),
    "num_steps": (_INT, _NULL),
    "num_epochs": (_INT, _NULL),
    "steps_per_epoch": (_INT, _NULL),
    "eval_steps": (_INT, _NULL),
    "eval_frequency": (_INT, _NULL),
    # checkpoints
    "checkpoint_path": (_STR, _NULL),
    "is_pretrained_checkpoint": (_BOOL,),
    "autoload_last_checkpoint": (_BOOL, _NULL),
    "save_initial_checkpoint": (_BOOL,),
    "checkpoint_steps": (_INT,),
    "keep_checkpoint_max": (_INT, _NULL),
    # logging and summaries
    "log_steps": (_INT,),
    "save_losses": (_BOOL,),
    "save_summary_steps": (_INT, _NULL),
    "check_loss_values": (_BOOL,),
    "enable_summaries": (_BOOL,),
    "show_debug_metrics": (_BOOL,),
    "save_stream_size": (_INT,),
    # step behaviour
    "use_cstorch_optimizer_step": (_BOOL, _NULL),
    "use_cs_grad_accum": (_BOOL, _NULL),
    # Cerebras cluster
    "num_csx": (_INT,),
    "num_wgt_servers": (_INT, _NULL),
    "num_act_servers": (_INT,),
    "num_workers_per_csx": (_INT,),
    "mgmt_address": (_STR, _NULL),
    "mgmt_namespace": (_STR, _NULL),
    "credentials_path": (_STR, _NULL),
    "mount_dirs": (_LIST, _NULL),
    "python_paths": (_LIST, _NULL),
    "job_labels": (_LIST, _NULL),
    "job_time_sec": (_INT, _NULL),
    "transfer_processes": (_INT, _NULL),
    "debug_args_path": (_STR, _NULL),
    "multireplica": (_BOOL, _NULL),
    "num_replicas": (_INT,),
    "autogen_policy": (_STR, _NULL),
    "variant": (_STR, _NULL),
    "use_appliance_data": (_BOOL, _NULL),
    "skip_train_recv_activations": (_BOOL, _NULL),
    "disable_version_check": (_BOOL,),
    # GPU data parallel
    "enable_distributed": (_BOOL,),
    "dist_addr": (_STR,),
    "dist_backend": (_STR,),
    "init_method": (_STR,),
    "main_process_id": (_INT,),
    "sync_batchnorm": (_BOOL,),
    # the 1.6/1.7 command line
    "cs_ip": (_STR, _NULL),
    "cpu": (_BOOL, _NULL),
    "appliance": (_BOOL, _NULL),
    "fabric_config_file": (_STR, _NULL),
    "streamer_logging": (_STR, _NULL),
    "num_workers": (_INT, _NULL),
}


# Keys that a model's extra command-line arguments (``extra_args_parser_fn``) add.
_extra_keys: set = set()


def register_runconfig_keys(keys) -> None:
    """Accepts ``keys`` in runconfig (the dests of a model's extra command-line arguments)."""
    _extra_keys.update(keys)


def _is(value, kind: str) -> bool:
    if kind == _NULL:
        return value is None
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _NUM:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == _STR:
        return isinstance(value, str)
    if kind == _LIST:
        return isinstance(value, (list, tuple))
    raise AssertionError(kind)


def validate_runconfig(runconfig: dict) -> None:
    """Raises ValueError for an unknown ``runconfig`` key or a value of the wrong type."""
    if not isinstance(runconfig, dict):
        raise ValueError(
            f"The params' runconfig section must be a mapping, got {type(runconfig).__name__}."
        )
    for key, value in runconfig.items():
        kinds = RUNCONFIG_TYPES.get(key)
        if kinds is None and key in _extra_keys:
            continue
        if kinds is None:
            raise ValueError(
                f"Unknown runconfig key {key!r}. Remove it or fix its spelling; valid keys are: "
                f"{', '.join(sorted(RUNCONFIG_TYPES))}."
            )
        if not any(_is(value, kind) for kind in kinds):
            raise ValueError(
                f"runconfig.{key} must be of type {' or '.join(kinds)}, got "
                f"{value!r} ({type(value).__name__})."
            )
        if key == "seed" and not -(2**63) <= value <= 2**64 - 1:  # torch.manual_seed's range
            raise ValueError(
                f"runconfig.seed must be an integer from -2**63 to 2**64 - 1 (the "
                f"range of torch.manual_seed), got {value!r}."
            )
