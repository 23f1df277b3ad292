"""The command lines of Model Zoo 1.x ``run.py`` scripts.

1.8/1.9::

    python run.py {CPU,GPU} -p params.yaml -m {train,eval,train_and_eval,eval_all} [...]
    python run.py CSX {pipeline,weight_streaming} -p params.yaml -m train [...]

1.6/1.7 (no device subcommand)::

    python run.py -p params.yaml -m {train,eval,train_and_eval} [-cpu] [--compile_only] ...

``get_params_from_args`` reads the params YAML and puts the command line into its
``runconfig`` section: command-line values override the YAML, list arguments
(``mount_dirs``, ``python_paths``) are concatenated with the YAML's, unset device settings
get their defaults, and YAML settings that belong to another device are dropped (as 1.8 did).
``runconfig.target_device`` records the device (1.6/1.7: CSX when ``--cs_ip``,
``--appliance``, ``--compile_only`` or ``--validate_only`` is given, CPU with ``-cpu``, else
GPU when one is available, else CPU).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable, List, Optional

from cstorch import config as cstorch_config
from cstorch.utils.yaml_files import YAMLFileError, load_yaml
from modelzoo.common.run_utils.utils import DeviceType, ExecutionStrategy

MODES = ["train", "eval", "train_and_eval", "eval_all"]
_LIST_ARGS = ("mount_dirs", "python_paths")

# Settings that only one kind of device takes, with their defaults when unset.
_CSX_DEFAULTS = {
    "compile_only": False,
    "validate_only": False,
    "num_workers_per_csx": 0,
    "compile_dir": None,
    "job_labels": None,
    "debug_args_path": None,
    "mount_dirs": None,
    "python_paths": None,
    "credentials_path": None,
    "mgmt_address": None,
    "job_time_sec": None,
    "disable_version_check": False,
}
_WS_DEFAULTS = {"num_csx": 1, "num_wgt_servers": None, "num_act_servers": 1}
_PIPELINE_DEFAULTS = {"multireplica": None}
_GPU_DEFAULTS = {"dist_addr": "localhost:8888", "dist_backend": "nccl", "init_method": "env://"}


def read_params_file(params_file: str) -> dict:
    if not params_file or not os.path.isfile(params_file):
        raise FileNotFoundError(
            f"Params file {params_file!r} not found; pass the YAML with -p/--params."
        )
    with open(params_file) as stream:
        try:
            params = load_yaml(stream, params_file)
        except YAMLFileError as error:  # a tag (!!python/...) or not YAML: said in one line
            raise YAMLFileError(f"Params file {params_file}: {error}") from None
    if not isinstance(params, dict):
        raise ValueError(
            f"{params_file} must hold a mapping of sections (train_input, model, "
            f"optimizer, runconfig, ...), got {type(params).__name__}."
        )
    params.setdefault("runconfig", {})
    if params["runconfig"] is None:
        params["runconfig"] = {}
    return params


def get_params(params_file: str, config: str = None) -> dict:
    params = read_params_file(params_file)
    if config:
        if not isinstance(params.get(config), dict):
            raise ValueError(f"--config {config!r} names no section of {params_file}.")
        params = params[config]
        params.setdefault("runconfig", {})
    return params


def _extra_parsers(extra_args_parser_fn) -> dict:
    """``{DeviceType.ANY or device or strategy: [parsers]}`` from the model's extra args."""
    if not extra_args_parser_fn:
        return {}
    extra = extra_args_parser_fn()
    if isinstance(extra, argparse.ArgumentParser):
        extra = [extra]
    if isinstance(extra, list):
        extra = {DeviceType.ANY: extra}
    if not isinstance(extra, dict):
        raise TypeError(
            "extra_args_parser_fn must return an ArgumentParser, a list of them, "
            "or a dict of device name -> list of them."
        )
    from modelzoo.common.pytorch.schema import register_runconfig_keys

    register_runconfig_keys(
        action.dest
        for parsers in extra.values()
        for parser in parsers
        for action in parser._actions
        if action.dest != "help"
    )
    return extra


def _general_arguments(parser, default_model_dir):
    parser.add_argument(
        "-p", "--params", required=True, help="Path to .yaml file with model parameters"
    )
    parser.add_argument(
        "-m", "--mode", required=True, choices=MODES, help="Select mode of execution for the run."
    )
    parser.add_argument(
        "-o", "--model_dir", default=None, help=f"Model directory (default {default_model_dir})."
    )
    parser.add_argument(
        "--checkpoint_path", default=None, help="Checkpoint to initialize weights from."
    )
    parser.add_argument(
        "--is_pretrained_checkpoint",
        action="store_true",
        default=None,
        help="Load only the weights of --checkpoint_path and start at step 0.",
    )
    parser.add_argument("--logging", default=None, help="Logging level (default INFO).")
    parser.add_argument("--max_steps", type=int, default=None)
    parser.add_argument("--eval_steps", type=int, default=None)
    parser.add_argument("--num_epochs", type=int, default=None)
    parser.add_argument("--num_steps", type=int, default=None)


def _csx_arguments(parser):
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--compile_only", action="store_true", default=None)
    group.add_argument("--validate_only", action="store_true", default=None)
    parser.add_argument("--num_workers_per_csx", type=int, default=None)
    parser.add_argument("-c", "--compile_dir", default=None)
    parser.add_argument("--job_labels", nargs="+", default=None)
    parser.add_argument("--debug_args_path", default=None)
    parser.add_argument("--mount_dirs", nargs="+", default=None)
    parser.add_argument("--python_paths", nargs="+", default=None)
    parser.add_argument("--credentials_path", default=None)
    parser.add_argument("--mgmt_address", default=None)
    parser.add_argument("--job_time_sec", type=int, default=None)
    parser.add_argument("--disable_version_check", action="store_true", default=None)


def _gpu_arguments(parser):
    parser.add_argument("-dist_addr", "--dist_addr", default=None)
    parser.add_argument(
        "-dist_backend", "--dist_backend", choices=["nccl", "mpi", "gloo"], default=None
    )
    parser.add_argument("-init_method", "--init_method", default=None)


def get_parser(run_dir: Optional[str] = None, extra_args_parser_fn=None) -> argparse.ArgumentParser:
    """The 1.8/1.9 parser: ``{CPU,GPU} ...`` or ``CSX {pipeline,weight_streaming} ...``."""
    default_model_dir = os.path.join(run_dir or ".", "model_dir")
    extra = _extra_parsers(extra_args_parser_fn)
    common = argparse.ArgumentParser(add_help=False, parents=extra.get(DeviceType.ANY, []))
    _general_arguments(common, default_model_dir)
    parser = argparse.ArgumentParser(
        epilog="Examples:\n    python run.py CPU --params params.yaml --mode train\n"
        "    python run.py CSX weight_streaming --params params.yaml --mode eval",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    devices = parser.add_subparsers(title="Target Device", dest="target_device")
    devices.required = True
    devices.add_parser(
        DeviceType.CPU, parents=[common] + extra.get(DeviceType.CPU, []), help="Run on CPU"
    )
    _gpu_arguments(
        devices.add_parser(
            DeviceType.GPU, parents=[common] + extra.get(DeviceType.GPU, []), help="Run on GPU"
        )
    )
    csx = devices.add_parser(DeviceType.CSX, help="Run on a Cerebras system (the modeled wafer)")
    strategies = csx.add_subparsers(title="Execution Strategy", dest="execution_strategy")
    strategies.required = True
    pipeline = strategies.add_parser(
        ExecutionStrategy.pipeline, parents=[common] + extra.get(ExecutionStrategy.pipeline, [])
    )
    _csx_arguments(pipeline)
    pipeline.add_argument("--multireplica", action="store_true", default=None)
    ws = strategies.add_parser(
        ExecutionStrategy.weight_streaming,
        parents=[common] + extra.get(ExecutionStrategy.weight_streaming, []),
    )
    _csx_arguments(ws)
    ws.add_argument("--num_csx", type=int, default=None)
    ws.add_argument("--num_wgt_servers", type=int, default=None)
    ws.add_argument("--num_act_servers", type=int, default=None)
    return parser


def get_legacy_parser(
    run_dir: Optional[str] = None, extra_args_parser_fn=None
) -> argparse.ArgumentParser:
    """The 1.6/1.7 parser (``modelzoo/common/pytorch/utils.py:get_parser`` in those
    releases): flags only, no device subcommand."""
    default_model_dir = os.path.join(run_dir or ".", "model_dir")
    extra = _extra_parsers(extra_args_parser_fn)
    parents = [p for parsers in extra.values() for p in parsers]
    parser = argparse.ArgumentParser(parents=parents)
    parser.add_argument(
        "-p", "--params", required=True, help="Path to .yaml file with model parameters"
    )
    parser.add_argument("--config", default=None, help="Section of the params file to use")
    parser.add_argument(
        "-m", "--mode", required=True, choices=["train", "eval", "train_and_eval", "eval_all"]
    )
    parser.add_argument(
        "-o", "--model_dir", default=None, help=f"Model directory (default {default_model_dir})."
    )
    parser.add_argument("-c", "--compile_dir", default=None)
    parser.add_argument("--checkpoint_path", default=None)
    parser.add_argument("--is_pretrained_checkpoint", action="store_true", default=None)
    parser.add_argument("--logging", default=None)
    parser.add_argument("-cs", "--cs_ip", default=None)
    parser.add_argument("-cpu", "--cpu", action="store_true", default=None)
    parser.add_argument("--compile_only", action="store_true", default=None)
    parser.add_argument("--validate_only", action="store_true", default=None)
    parser.add_argument("--appliance", action="store_true", default=None)
    parser.add_argument(
        "--execution_strategy", choices=ExecutionStrategy.strategies(), default=None
    )
    parser.add_argument("--multireplica", action="store_true", default=None)
    parser.add_argument("--fabric_config_file", default=None)
    parser.add_argument("--credentials_path", default=None)
    parser.add_argument("--mgmt_address", default=None)
    parser.add_argument("--num_csx", type=int, default=None)
    parser.add_argument("--num_wgt_servers", type=int, default=None)
    parser.add_argument("--num_workers_per_csx", type=int, default=None)
    parser.add_argument("--debug_args_path", default=None)
    parser.add_argument("--mount_dirs", nargs="+", default=None)
    parser.add_argument("--python_paths", nargs="+", default=None)
    parser.add_argument("--transfer_processes", type=int, default=None)
    parser.add_argument("--job_labels", nargs="+", default=None)
    parser.add_argument("--max_steps", type=int, default=None)
    parser.add_argument("--num_epochs", type=int, default=None)
    parser.add_argument("--num_steps", type=int, default=None)
    parser.add_argument("--eval_steps", type=int, default=None)
    _gpu_arguments(parser)
    return parser


def _merge(runconfig: dict, args: dict, sysadmin: dict) -> None:
    """Command line over YAML over the sysadmin defaults; list arguments concatenate."""
    for key, value in args.items():
        if key in ("params", "config"):
            continue
        if key in _LIST_ARGS:
            merged = []
            for source in (value, runconfig.get(key), sysadmin.get(key)):
                if source is not None:
                    merged.extend([source] if isinstance(source, str) else source)
            if merged:
                runconfig[key] = merged
            continue
        if value is not None:
            runconfig[key] = value
        elif runconfig.get(key) is None and sysadmin.get(key) is not None:
            runconfig[key] = sysadmin[key]


def _device_defaults(target, strategy) -> dict:
    if target == DeviceType.CSX:
        extra = _PIPELINE_DEFAULTS if strategy == ExecutionStrategy.pipeline else _WS_DEFAULTS
        return {**_CSX_DEFAULTS, **extra}
    if target == DeviceType.GPU:
        return dict(_GPU_DEFAULTS)
    return {}


def _legacy_target(runconfig: dict) -> str:
    if any(runconfig.get(k) for k in ("cs_ip", "appliance", "compile_only", "validate_only")):
        return DeviceType.CSX
    if runconfig.get("cpu"):
        return DeviceType.CPU
    import torch

    return DeviceType.GPU if torch.cuda.is_available() else DeviceType.CPU


def is_legacy_command_line(argv: List[str]) -> bool:
    """True for a 1.6/1.7 command line (no ``CPU``/``GPU``/``CSX`` subcommand first)."""
    return not argv or argv[0] not in DeviceType.devices() + ["-h", "--help"]


def get_params_from_args(
    run_dir: Optional[str] = None,
    argv: Optional[List[str]] = None,
    extra_args_parser_fn: Optional[Callable] = None,
) -> dict:
    """The params of a 1.x ``run.py`` invocation (either command line), with ``runconfig``
    completed from the command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    legacy = is_legacy_command_line(argv)
    parser = (get_legacy_parser if legacy else get_parser)(run_dir, extra_args_parser_fn)
    args = vars(parser.parse_args(argv))
    try:
        params = get_params(args["params"], args.get("config"))
    except YAMLFileError as error:  # a command-line error, as argparse's: exit status 2
        parser.error(str(error))
    runconfig = params["runconfig"]
    sysadmin_file = cstorch_config.cluster_defaults.value
    sysadmin = (read_params_file(sysadmin_file).get("runconfig") or {}) if sysadmin_file else {}
    _merge(runconfig, args, sysadmin)

    if legacy:
        runconfig["target_device"] = _legacy_target(runconfig)
    target, strategy = runconfig["target_device"], runconfig.get("execution_strategy")
    own = _device_defaults(target, strategy)
    other = set().union(
        *(
            _device_defaults(d, s)
            for d, s in (
                (DeviceType.CSX, ExecutionStrategy.pipeline),
                (DeviceType.CSX, ExecutionStrategy.weight_streaming),
                (DeviceType.GPU, None),
            )
        )
    ) - set(own)
    if not legacy:
        dropped = sorted(k for k in other if runconfig.get(k) not in (None, False))
        for key in dropped:
            runconfig.pop(key)
        if dropped:
            logging.info(
                f"User specified a {target} run, but the following non-{target} "
                f"configurations were found in params file: {dropped}. Ignoring "
                "these arguments and continuing."
            )
    for key, value in own.items():
        if runconfig.get(key) is None:
            runconfig[key] = value
    runconfig.setdefault("compile_only", False)
    runconfig.setdefault("validate_only", False)
    if runconfig.get("compile_only") is None:
        runconfig["compile_only"] = False
    if runconfig.get("validate_only") is None:
        runconfig["validate_only"] = False
    if not runconfig.get("model_dir"):
        runconfig["model_dir"] = os.path.join(run_dir or ".", "model_dir")
    if runconfig.get("mode") not in MODES:
        raise ValueError(f"runconfig.mode must be one of {MODES}, got {runconfig.get('mode')!r}.")
    if runconfig.get("is_pretrained_checkpoint") and not runconfig.get("checkpoint_path"):
        raise RuntimeError(
            "'--is_pretrained_checkpoint' can only be used if a '--checkpoint_path' is provided."
        )
    if runconfig.get("compile_only") and runconfig.get("validate_only"):
        raise ValueError("Please set only one of compile_only and validate_only.")
    os.makedirs(runconfig["model_dir"], exist_ok=True)
    runconfig.setdefault("service_dir", runconfig["model_dir"])
    return params
