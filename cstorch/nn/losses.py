"""torch's loss modules, accepting cerebras-pytorch's extra ``use_autogen`` argument.

``use_autogen=True`` asks the CSX compiler to generate the loss kernel from its ops; it has
no effect on numbers, and on this implementation no effect at all (kept as
``self.autogen_enabled``).
"""

from __future__ import annotations

import functools
import inspect

import torch

_NAMES = (
    "BCELoss",
    "BCEWithLogitsLoss",
    "CosineEmbeddingLoss",
    "CrossEntropyLoss",
    "CTCLoss",
    "HingeEmbeddingLoss",
    "KLDivLoss",
    "L1Loss",
    "MarginRankingLoss",
    "MSELoss",
    "MultiLabelSoftMarginLoss",
    "NLLLoss",
    "PoissonNLLLoss",
    "TripletMarginLoss",
    "TripletMarginWithDistanceLoss",
)


def accepts_use_autogen(init):
    """Wraps a loss ``__init__`` so that it also accepts (and records) ``use_autogen``."""

    @functools.wraps(init)
    def wrapped(self, *args, use_autogen: bool = False, **kwargs):
        init(self, *args, **kwargs)
        self.autogen_enabled = use_autogen

    return wrapped


def _autogen_subclass(torch_cls):
    """A subclass of ``torch_cls`` whose ``__init__`` takes torch's arguments (all of them
    also positionally, as cerebras-pytorch documents them) plus ``use_autogen``."""
    torch_init = torch_cls.__init__
    params = [
        p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for p in inspect.signature(torch_init).parameters.values()
    ]
    params.append(
        inspect.Parameter("use_autogen", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False)
    )
    signature = inspect.Signature(params)

    def __init__(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs).arguments
        del arguments[params[0].name]
        use_autogen = arguments.pop("use_autogen", False)
        torch_init(self, **arguments)
        self.autogen_enabled = use_autogen

    __init__.__signature__ = signature
    return type(
        torch_cls.__name__,
        (torch_cls,),
        {
            "__init__": __init__,
            "__module__": __name__,
            "__qualname__": torch_cls.__name__,
            "__doc__": f"``torch.nn.{torch_cls.__name__}`` that also accepts ``use_autogen``.",
        },
    )


for _name in _NAMES:
    globals()[_name] = _autogen_subclass(getattr(torch.nn, _name))

__all__ = list(_NAMES)
