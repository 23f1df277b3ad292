"""Implicit loops for autoregressive inference (CSX only in cerebras-pytorch).

An implicit loop reruns the compiled model on the device, feeding each output token back
into the input, until a stop sequence appears. It needs device-side control flow of the
Cerebras runtime; neither the CPU/GPU backends nor the modeled wafer provide it, so
``start_implicit_loop`` and ``update_implicit_loop`` raise NotImplementedError after
validating their arguments. ``get_loop_iteration_slice`` is a plain gather and works
everywhere.
"""

from __future__ import annotations

from typing import List, Optional, Union

import torch

from jax_backend.errors import CstorchNotImplementedError, CstorchTypeError, CstorchValueError

_UNSUPPORTED = (
    "Implicit loops run on the Cerebras runtime's device-side control flow, which {where} "
    "does not provide. Run the generation loop in Python instead (call the traced step once "
    "per generated token)."
)


def _where() -> str:
    from cstorch.backend import current_backend_impl

    impl = current_backend_impl()
    return "the modeled CSX backend" if impl.is_csx else f"the {impl.backend_type.name} backend"


def _check_int32(name: str, tensor) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int32:
        raise CstorchTypeError(
            f"Expected `{name}` to be an int32 tensor, got "
            f"{getattr(tensor, 'dtype', type(tensor).__name__)}."
        )


def start_implicit_loop(input_tensor: torch.IntTensor, loop_dim: int) -> torch.IntTensor:
    """The index tensor of an implicit loop over ``input_tensor`` along ``loop_dim``."""
    _check_int32("input_tensor", input_tensor)
    if not isinstance(loop_dim, int) or not 0 <= loop_dim < input_tensor.dim():
        raise CstorchValueError(
            f"loop_dim must be an int in [0, {input_tensor.dim()}), got {loop_dim!r}."
        )
    raise CstorchNotImplementedError(_UNSUPPORTED.format(where=_where()))


def get_loop_iteration_slice(
    input_tensor: torch.IntTensor, index_tensor: torch.IntTensor
) -> torch.IntTensor:
    """The slice of ``input_tensor`` at ``index_tensor`` along the loop dimension (the last
    dimension of ``index_tensor``)."""
    input_shape, index_shape = list(input_tensor.shape), list(index_tensor.shape)
    loop_dim = len(index_shape) - 1
    index = index_tensor.view(index_shape + [1] * (len(input_shape) - len(index_shape)))
    index = index.broadcast_to(index_shape + input_shape[len(index_shape) :]).long()
    return input_tensor.gather(loop_dim, index)


def update_implicit_loop(
    input_tensor: torch.IntTensor,
    index_tensor: torch.IntTensor,
    update_tensor: torch.IntTensor,
    stop_sequences_tensor: torch.IntTensor,
    start_token: Union[int, List[int]],
    max_tokens: Optional[int] = None,
) -> torch.IntTensor:
    """Configures the update step of the active implicit loop (see module docstring)."""
    for name, tensor in (
        ("input_tensor", input_tensor),
        ("index_tensor", index_tensor),
        ("update_tensor", update_tensor),
        ("stop_sequences_tensor", stop_sequences_tensor),
    ):
        _check_int32(name, tensor)
    tokens = start_token if isinstance(start_token, list) else [start_token]
    if not tokens or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
    ):
        raise CstorchValueError(
            f"start_token must be a non-negative int or a list of them, got {start_token!r}."
        )
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
        raise CstorchValueError(f"max_tokens must be a positive int or None, got {max_tokens!r}.")
    raise CstorchNotImplementedError(_UNSUPPORTED.format(where=_where()))
