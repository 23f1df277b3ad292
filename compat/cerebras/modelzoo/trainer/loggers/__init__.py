"""Loggers: the destinations of ``trainer.log_metrics``."""

from cerebras.modelzoo.trainer.loggers.logger import Logger
from cerebras.modelzoo.trainer.loggers.progress import ProgressLogger
from cerebras.modelzoo.trainer.loggers.tensorboard import TensorBoardLogger

__all__ = ["Logger", "ProgressLogger", "TensorBoardLogger"]
