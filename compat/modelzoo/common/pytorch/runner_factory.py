"""``PyTorchBaseRunner.create``: picks the backend and the runner class for the params.

The cstorch backend is created here, before the model is built, so parameters and metrics
the model creates are registered with it. One backend per process: a second run in the same
process reuses it when the target matches.
"""

from __future__ import annotations

import inspect
import os
import warnings

import torch

import cstorch
from cstorch.backend import get_or_create
from modelzoo.common.pytorch import pytorch_base_runner
from modelzoo.common.pytorch.half_dtype import half_dtype_instance
from modelzoo.common.pytorch.pytorch_cs_appliance import PyTorchCSAppliance
from modelzoo.common.pytorch.pytorch_cs_compiler import PyTorchCSCompiler
from modelzoo.common.pytorch.pytorch_dist_runner import PyTorchDistRunner
from modelzoo.common.pytorch.pytorch_runner import PyTorchRunner
from modelzoo.common.pytorch.PyTorchBaseModel import PyTorchBaseModel
from modelzoo.common.pytorch.utils import RunConfigParamsValidator
from modelzoo.common.run_utils.utils import DeviceType


def _backend(kind: str, runconfig: dict, **kwargs):
    artifact_dir = os.path.join(runconfig.get("model_dir", "./"), "cerebras_logs")
    return get_or_create(kind, artifact_dir=artifact_dir, **kwargs)


def _build_model(model_fn, params, device=None) -> PyTorchBaseModel:
    if inspect.isclass(model_fn) and issubclass(model_fn, PyTorchBaseModel):
        return model_fn(params)  # 1.6/1.7: the model class is itself a PyTorchBaseModel
    return PyTorchBaseModel(params, model_fn, device)


def _check_runner_cls(runner_cls, default):
    if runner_cls is None:
        return default
    if not (inspect.isclass(runner_cls) and issubclass(runner_cls, default)):
        raise TypeError(
            f"runner_cls must be a subclass of {default.__name__} for this run "
            f"(the runner create() picks for the params), got {runner_cls!r}."
        )
    return runner_cls


def create_runner(model_fn, params: dict, runner_cls=None):
    runconfig = params["runconfig"]
    RunConfigParamsValidator().validate(runconfig)
    compile_only = bool(runconfig.get("compile_only"))
    validate_only = bool(runconfig.get("validate_only"))
    if compile_only and validate_only:
        raise ValueError("Please set one of compile_only and validate_only")
    use_bfloat16 = bool((params.get("model") or {}).get("use_bfloat16", False))
    half_dtype_instance.use_bfloat16 = use_bfloat16

    target = runconfig.get("target_device")
    if target == DeviceType.CSX or compile_only or validate_only:
        if runconfig.get("num_csx", 1) > 1 and runconfig.get("execution_strategy") == "pipeline":
            raise ValueError(
                "Using multiple CS-X systems is only supported with the "
                "weight_streaming execution strategy."
            )
        from cstorch.distributed import ClusterConfig

        _backend(
            "CSX",
            runconfig,
            compile_only=compile_only,
            validate_only=validate_only,
            compile_dir=runconfig.get("compile_dir")
            or os.path.join(runconfig.get("model_dir", "./"), "cerebras_compile"),
            cluster_config=ClusterConfig(num_csx=runconfig.get("num_csx") or 1),
        )
        cstorch.amp.set_half_dtype("bfloat16" if use_bfloat16 else "float16")
        model = _build_model(model_fn, params)
        default = PyTorchCSCompiler if (compile_only or validate_only) else PyTorchCSAppliance
        return _check_runner_cls(runner_cls, default)(model, params)

    if (
        target == DeviceType.GPU
        and cstorch.backend() is None
        or (cstorch.backend() is not None and cstorch.backend().is_gpu)
    ):
        try:  # the GPU backend runs where JAX sees a GPU
            _backend("GPU", runconfig)
        except RuntimeError as error:
            if target == DeviceType.GPU:
                warnings.warn(f"GPU requested but unavailable ({error}); running on CPU.")
    if cstorch.backend() is None or cstorch.backend().is_cpu:
        _backend("CPU", runconfig)
        device = torch.device("cpu")
        model = _build_model(model_fn, params, device)
        return _check_runner_cls(runner_cls, PyTorchRunner)(device, model, params)
    if params["model"].get("mixed_precision"):
        cstorch.amp.set_half_dtype("bfloat16" if use_bfloat16 else "float16")
    if runconfig.get("enable_distributed", False):
        model = _build_model(model_fn, params)
        return _check_runner_cls(runner_cls, PyTorchDistRunner)(model, params)
    device = torch.device("cuda")
    model = _build_model(model_fn, params, device)
    return _check_runner_cls(runner_cls, PyTorchRunner)(device, model, params)


pytorch_base_runner.register_runner_factory(create_runner)
