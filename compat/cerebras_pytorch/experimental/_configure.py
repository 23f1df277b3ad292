"""1.8 ``configure(...)`` and ``compile(model, backend=...)``.

``configure`` records the run's settings once per process (as the 1.8 API did: a second call
raises). ``compile`` creates the cstorch backend the first time (the WSE names run on the
modeled wafer, the ``CSX`` backend), registers the model and returns the compiled model,
which also carries ``.backend`` with the 1.8 queries (``is_wse()``, ``is_cpu()``, ...).
"""

from __future__ import annotations

import os

import torch

import cstorch
from cstorch.backend import get_or_create

# configure()'s keywords in 1.8/1.9 (the Model Zoo's run_cstorch_flow passes all of them).
CONFIGURE_KEYS = (
    "model_dir",
    "compile_dir",
    "compile_only",
    "validate_only",
    "checkpoint_steps",
    "seed",
    "num_csx",
    "max_wgt_servers",
    "mgmt_address",
    "mgmt_namespace",
    "credentials_path",
    "debug_args",
    "mount_dirs",
    "python_paths",
    "transfer_processes",
    "num_workers_per_csx",
    "execution_strategy",
    "job_labels",
    "max_act_per_csx",
    "job_time_sec",
    "disable_version_check",
    "service_workdir",
    "use_cs_grad_accum",
    "precision_opt_level",
)

_BACKENDS = {
    "WSE_WS": "CSX",
    "WSE": "CSX",
    "WSE_PIPELINE": "CSX",
    "CSX": "CSX",
    "CPU": "CPU",
    "GPU": "GPU",
}

_settings: dict | None = None


def _forget_settings() -> None:
    global _settings
    _settings = None


cstorch.config.config.on_reset(_forget_settings)  # cstorch.config.reset()


def configure(**kwargs) -> None:
    """Configures the run (once per process): ``model_dir``, ``compile_dir``,
    ``compile_only``, ``validate_only``, ``checkpoint_steps``, ``seed`` and the cluster
    settings (``num_csx``, ``max_wgt_servers``, ...)."""
    global _settings
    if _settings is not None:
        raise RuntimeError(
            "cstorch.configure() was already called in this process; the run "
            "can only be configured once. Pass every setting in one call."
        )
    unknown = sorted(set(kwargs) - set(CONFIGURE_KEYS))
    if unknown:
        raise TypeError(
            f"configure() got unknown settings {unknown}; valid ones are {sorted(CONFIGURE_KEYS)}."
        )
    if kwargs.get("compile_only") and kwargs.get("validate_only"):
        raise ValueError("Set only one of compile_only and validate_only.")
    steps = kwargs.get("checkpoint_steps")
    if steps is not None and (not isinstance(steps, int) or steps < 0):
        raise ValueError(f"checkpoint_steps must be a non-negative int, got {steps!r}.")
    _settings = dict(kwargs)
    if kwargs.get("seed") is not None:
        torch.manual_seed(kwargs["seed"])


def settings() -> dict:
    return dict(_settings or {})


class LegacyBackendInfo:
    """What 1.8's ``compiled_model.backend`` answered."""

    def __init__(self, backend, requested: str):
        self._backend = backend
        self.name = requested

    def is_wse(self) -> bool:
        return self._backend.is_csx

    def is_cpu(self) -> bool:
        return self._backend.is_cpu

    def is_gpu(self) -> bool:
        return self._backend.is_gpu

    @property
    def device(self):
        return self._backend.device

    def __getattr__(self, name):
        return getattr(self._backend, name)


def _backend_type(name) -> str:
    key = str(name).upper()
    if key not in _BACKENDS:
        raise ValueError(
            f"Unknown backend {name!r}; expected one of {sorted(_BACKENDS)} "
            "(case-insensitive). The WSE names run on the modeled wafer."
        )
    return _BACKENDS[key]


def get_backend(name):
    """The process's cstorch backend for a 1.8 backend name, created on first use."""
    wanted = _backend_type(name)
    mismatch = lambda existing: RuntimeError(  # noqa: E731
        f"A {existing.backend_type.name} backend already exists in this process; cannot "
        f"also run on {name!r}. Use one backend per process."
    )
    if cstorch.backend() is not None:
        return get_or_create(wanted, mismatch=mismatch)
    opts = settings()
    model_dir = opts.get("model_dir") or "./"
    artifact_dir = os.path.join(model_dir, "cerebras_logs")
    if wanted == "CSX":
        from cstorch.distributed import ClusterConfig

        cluster = {
            k: opts[v]
            for k, v in (
                ("num_csx", "num_csx"),
                ("max_wgt_servers", "max_wgt_servers"),
                ("max_act_per_csx", "max_act_per_csx"),
            )
            if opts.get(v) is not None
        }
        return get_or_create(
            "CSX",
            mismatch=mismatch,
            artifact_dir=artifact_dir,
            compile_dir=opts.get("compile_dir") or "cached_compile",
            compile_only=bool(opts.get("compile_only")),
            validate_only=bool(opts.get("validate_only")),
            cluster_config=ClusterConfig(**cluster),
        )
    if opts.get("compile_only") or opts.get("validate_only"):
        raise ValueError(
            "compile_only/validate_only need a WSE backend (the modeled wafer); "
            f"got backend {name!r}."
        )
    return get_or_create(wanted, mismatch=mismatch, artifact_dir=artifact_dir)


def compile(model: torch.nn.Module, backend="WSE_WS"):  # the 1.8 name
    """Registers ``model`` with the backend named ``backend`` and returns the compiled model
    (call it inside a ``@compile_step`` function)."""
    if not isinstance(backend, str):  # 1.9: a backend object
        compiled = cstorch.compile(model, backend)
        compiled.backend = LegacyBackendInfo(cstorch.backend(), str(backend))
        return compiled
    impl = get_backend(backend)
    compiled = cstorch.compile(model, impl)
    compiled.backend = LegacyBackendInfo(impl, backend)
    return compiled
