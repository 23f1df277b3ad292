"""Trainer callbacks: the core ones every Trainer has, and optional ones users add."""

from cerebras.modelzoo.trainer.callbacks.artifact_dir import ArtifactDirCallback
from cerebras.modelzoo.trainer.callbacks.autorestart import AutoRestart
from cerebras.modelzoo.trainer.callbacks.backend import BackendCallback
from cerebras.modelzoo.trainer.callbacks.callback import (
    GLOBAL_CALLBACK_REGISTRY,
    Callback,
    CoreCallback,
    ValidationCallback,
    register_global_callback,
)
from cerebras.modelzoo.trainer.callbacks.checkpoint import (
    Checkpoint,
    KeepNCheckpoints,
    LoadCheckpointStates,
)
from cerebras.modelzoo.trainer.callbacks.dataloader import DataLoaderCallback, LogInputSummaries
from cerebras.modelzoo.trainer.callbacks.flags import (
    GlobalFlags,
    ScopedTrainFlags,
    ScopedValidateFlags,
)
from cerebras.modelzoo.trainer.callbacks.grad_accum import GradientAccumulationCallback
from cerebras.modelzoo.trainer.callbacks.logging import Logging
from cerebras.modelzoo.trainer.callbacks.loop import LoopCallback, TrainingLoop, ValidationLoop
from cerebras.modelzoo.trainer.callbacks.loss import CheckLoss, LossAccumulationCallback
from cerebras.modelzoo.trainer.callbacks.metrics import ModelEvalMetrics
from cerebras.modelzoo.trainer.callbacks.model import ModelCallback
from cerebras.modelzoo.trainer.callbacks.model_stats import CountParams
from cerebras.modelzoo.trainer.callbacks.norm import ComputeNorm
from cerebras.modelzoo.trainer.callbacks.optimizer import LogOptimizerParamGroup, OptimizerCallback
from cerebras.modelzoo.trainer.callbacks.precision import MixedPrecision, Precision
from cerebras.modelzoo.trainer.callbacks.profiler import RateProfiler
from cerebras.modelzoo.trainer.callbacks.reproducibility import Reproducibility
from cerebras.modelzoo.trainer.callbacks.schedulers import SchedulersCallback
from cerebras.modelzoo.trainer.callbacks.selective_grad import SelectiveGrad
from cerebras.modelzoo.trainer.callbacks.sparsity import LogSparsity, SparsityCallback

__all__ = [
    "ArtifactDirCallback",
    "AutoRestart",
    "BackendCallback",
    "Callback",
    "CheckLoss",
    "Checkpoint",
    "ComputeNorm",
    "CoreCallback",
    "CountParams",
    "DataLoaderCallback",
    "GLOBAL_CALLBACK_REGISTRY",
    "GlobalFlags",
    "GradientAccumulationCallback",
    "KeepNCheckpoints",
    "LoadCheckpointStates",
    "LogInputSummaries",
    "LogOptimizerParamGroup",
    "LogSparsity",
    "Logging",
    "LoopCallback",
    "LossAccumulationCallback",
    "MixedPrecision",
    "ModelCallback",
    "ModelEvalMetrics",
    "OptimizerCallback",
    "Precision",
    "RateProfiler",
    "Reproducibility",
    "SchedulersCallback",
    "ScopedTrainFlags",
    "ScopedValidateFlags",
    "SelectiveGrad",
    "SparsityCallback",
    "TrainingLoop",
    "ValidationCallback",
    "ValidationLoop",
    "register_global_callback",
]
