"""TensorBoard summaries (import explicitly: ``import cerebras.pytorch.utils.tensorboard``)."""

from cstorch.utils.tensorboard.writer import SummaryReader, SummaryWriter

__all__ = ["SummaryReader", "SummaryWriter"]
