"""``cstorch.nn``: losses, Cerebras functional ops, Parameter/Buffer, Scope, SelectiveGrad."""

from cstorch.nn import functional
from cstorch.nn.custom_losses import (
    DiceCELoss,
    DiceLoss,
    GaussianNLLLoss,
    HuberLoss,
    MultiMarginLoss,
    SmoothL1Loss,
)
from cstorch.nn.losses import (
    BCELoss,
    BCEWithLogitsLoss,
    CosineEmbeddingLoss,
    CrossEntropyLoss,
    CTCLoss,
    HingeEmbeddingLoss,
    KLDivLoss,
    L1Loss,
    MarginRankingLoss,
    MSELoss,
    MultiLabelSoftMarginLoss,
    NLLLoss,
    PoissonNLLLoss,
    TripletMarginLoss,
    TripletMarginWithDistanceLoss,
)
from cstorch.nn.parameter import Buffer, Parameter
from cstorch.nn.scope import Scope
from cstorch.nn.selective_grad import SelectiveGrad as SelectiveGrad

__all__ = [
    "Buffer",
    "Scope",
    "Parameter",
    "functional",
    "BCELoss",
    "BCEWithLogitsLoss",
    "CosineEmbeddingLoss",
    "CrossEntropyLoss",
    "CTCLoss",
    "DiceCELoss",
    "DiceLoss",
    "GaussianNLLLoss",
    "HingeEmbeddingLoss",
    "HuberLoss",
    "KLDivLoss",
    "L1Loss",
    "MarginRankingLoss",
    "MSELoss",
    "MultiLabelSoftMarginLoss",
    "MultiMarginLoss",
    "NLLLoss",
    "PoissonNLLLoss",
    "SmoothL1Loss",
    "TripletMarginLoss",
    "TripletMarginWithDistanceLoss",
]
