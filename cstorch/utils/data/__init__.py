"""Data loading for compiled steps."""

from cstorch.utils.data import dataloader as dataloader, utils as utils
from cstorch.utils.data.data_executor import DataExecutor, current_executor as current_executor
from cstorch.utils.data.dataloader import (
    DataLoader,
    DataLoaderCheckpoint as DataLoaderCheckpoint,
    RestartableDataLoader,
)
from cstorch.utils.data.dataset import SyntheticDataset
from cstorch.utils.data.sampler import DistributedSampler
from cstorch.utils.data.utils import Schedule as Schedule, compute_num_steps as compute_num_steps

__all__ = [
    "DataExecutor",
    "DataLoader",
    "DistributedSampler",
    "RestartableDataLoader",
    "SyntheticDataset",
]
