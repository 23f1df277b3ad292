"""Mask initialisation methods of ``cstorch.sparse``.

An init method is ``fn(p, sparsity, score_shaper=None, device=None) -> bool tensor`` of
``p``'s shape. Masks are initialised eagerly, at the start of a run (or before the first
compiled step), from the parameters' current values; ``random`` draws its scores from
torch's default generator, as cerebras-pytorch does on CPU.
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional, Union

import numpy as np
import torch

from cstorch.sparse.utils import ScoreShaper, make_mask_topk_sparsity
from jax_backend.errors import CstorchValueError

InitMethodCallable = Callable[..., torch.Tensor]
InitMethodType = Union[str, InitMethodCallable]


def random(
    p: torch.nn.Parameter,
    sparsity: torch.FloatTensor,
    score_shaper: Optional[ScoreShaper] = None,
    device: Optional[torch.device] = None,
) -> torch.BoolTensor:
    """A uniformly random pattern: the top-k of uniform random scores."""
    score = torch.rand_like(p.detach(), device="cpu")
    return make_mask_topk_sparsity(score, sparsity, score_shaper)


def topk(
    p: torch.nn.Parameter,
    sparsity: torch.FloatTensor,
    score_shaper: Optional[ScoreShaper] = None,
    device: Optional[torch.device] = None,
) -> torch.BoolTensor:
    """Prunes the lowest-magnitude weights."""
    return make_mask_topk_sparsity(p.detach().abs(), sparsity, score_shaper)


def from_zeros(
    p: torch.nn.Parameter,
    sparsity: torch.FloatTensor,
    score_shaper: Optional[ScoreShaper] = None,
    device: Optional[torch.device] = None,
) -> torch.BoolTensor:
    """The weights' current zeros are the pruned connections (``sparsity`` is ignored)."""
    return p.detach() != 0


def checkerboard(
    p: torch.nn.Parameter,
    sparsity: torch.FloatTensor,
    score_shaper: Optional[ScoreShaper] = None,
    device: Optional[torch.device] = None,
) -> torch.BoolTensor:
    """A pattern spread as evenly as possible over the last dimension, each row shifted
    (for stress and performance tests)."""
    density = 1.0 - float(sparsity)
    if density <= 0.0:
        return torch.zeros(tuple(p.shape), dtype=torch.bool)
    cols = p.shape[-1]
    padding = int(np.ceil(cols / density + 1e-5))
    levels = torch.floor(torch.arange(cols + padding) * density + 1e-5)
    row = levels[1:] != levels[:-1]
    if p.dim() == 2:
        shift = -int(np.floor(1 / density - 1e-5))
        row = torch.stack([torch.roll(row, r * shift) for r in range(p.shape[0])])
    return row[..., :cols].clone()


_INIT_METHODS = {
    "random": random,
    "topk": topk,
    "from_zeros": from_zeros,
    "checkerboard": checkerboard,
}


def make_init_method(init_method: InitMethodType) -> InitMethodCallable:
    """The init method named by ``init_method`` (one of ``random``, ``topk``, ``from_zeros``,
    ``checkerboard``), or ``init_method`` itself when it is a function accepting
    ``(p, sparsity, score_shaper=None, device=None)``."""
    error = (
        f"Unknown `init_method`: {init_method!r}. Valid options are one of the built-in "
        f"{list(_INIT_METHODS)} or a function with signature "
        "(p, sparsity, score_shaper=None, device=None) -> BoolTensor."
    )
    if isinstance(init_method, str):
        if init_method not in _INIT_METHODS:
            raise CstorchValueError(error)
        return _INIT_METHODS[init_method]
    if callable(init_method):
        try:
            inspect.signature(init_method).bind(None, None, score_shaper=None, device=None)
        except TypeError:
            raise CstorchValueError(error) from None
        except ValueError:  # builtins without a signature: trust them
            pass
        return init_method
    raise CstorchValueError(error)
