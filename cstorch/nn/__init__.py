"""``cstorch.nn``: losses, Cerebras functional ops, Parameter/Buffer, Scope, SelectiveGrad."""

from cstorch.nn import functional
from cstorch.nn.custom_losses import DiceCELoss
from cstorch.nn.custom_losses import DiceLoss
from cstorch.nn.custom_losses import GaussianNLLLoss
from cstorch.nn.custom_losses import HuberLoss
from cstorch.nn.custom_losses import MultiMarginLoss
from cstorch.nn.custom_losses import SmoothL1Loss
from cstorch.nn.losses import BCELoss
from cstorch.nn.losses import BCEWithLogitsLoss
from cstorch.nn.losses import CosineEmbeddingLoss
from cstorch.nn.losses import CrossEntropyLoss
from cstorch.nn.losses import CTCLoss
from cstorch.nn.losses import HingeEmbeddingLoss
from cstorch.nn.losses import KLDivLoss
from cstorch.nn.losses import L1Loss
from cstorch.nn.losses import MarginRankingLoss
from cstorch.nn.losses import MSELoss
from cstorch.nn.losses import MultiLabelSoftMarginLoss
from cstorch.nn.losses import NLLLoss
from cstorch.nn.losses import PoissonNLLLoss
from cstorch.nn.losses import TripletMarginLoss
from cstorch.nn.losses import TripletMarginWithDistanceLoss
from cstorch.nn.parameter import Buffer
from cstorch.nn.parameter import Parameter
from cstorch.nn.scope import Scope
from cstorch.nn.selective_grad import SelectiveGrad as SelectiveGrad

__all__ = [
    "Buffer", "Scope", "Parameter", "functional",
    "BCELoss", "BCEWithLogitsLoss", "CosineEmbeddingLoss", "CrossEntropyLoss", "CTCLoss",
    "DiceCELoss", "DiceLoss", "GaussianNLLLoss", "HingeEmbeddingLoss", "HuberLoss", "KLDivLoss",
    "L1Loss", "MarginRankingLoss", "MSELoss", "MultiLabelSoftMarginLoss", "MultiMarginLoss",
    "NLLLoss", "PoissonNLLLoss", "SmoothL1Loss", "TripletMarginLoss",
    "TripletMarginWithDistanceLoss",
]
