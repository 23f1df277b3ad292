"""Cerebras functional ops with their CPU fallbacks.

On a Cerebras system these map to dedicated kernels; here each is its plain torch equivalent
(the "CPU fallback" of the reference), so it is traced, lowered and differentiated like any
other torch code. Shape preconditions are checked with asserts, as in the reference.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from jax_backend.errors import CstorchNotImplementedError, CstorchValueError

BEGIN_FORWARD = "BEGIN_FORWARD"
BEGIN_BACKWARD = "BEGIN_BACKWARD"
END_FORWARD = "END_FORWARD"
END_BACKWARD = "END_BACKWARD"
_BOUNDARIES = (BEGIN_FORWARD, BEGIN_BACKWARD, END_FORWARD, END_BACKWARD)


def one_hot(array: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``array`` with a trailing one-hot axis of ``num_classes`` (int32)."""
    if num_classes < 1:
        raise CstorchValueError(f"one_hot needs a positive num_classes, got {num_classes}.")
    zeros = torch.zeros(array.shape + (num_classes,), dtype=torch.int32, device=array.device)
    return zeros.scatter(-1, array.unsqueeze(-1).to(torch.int64), 1)


def scope_boundary(input: torch.Tensor, boundary_type: str, scope_name: str) -> torch.Tensor:
    """Marks a scope boundary after ``input`` (``boundary_type`` is one of BEGIN_FORWARD,
    BEGIN_BACKWARD, END_FORWARD, END_BACKWARD); returns ``input``."""
    if boundary_type not in _BOUNDARIES:
        raise CstorchValueError(
            f"boundary_type must be one of {_BOUNDARIES}, got {boundary_type!r}."
        )
    return input


class _EnterScope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, scope_name):
        ctx.scope_name = scope_name
        return scope_boundary(input, BEGIN_FORWARD, scope_name)

    @staticmethod
    def backward(ctx, grad_output):
        return scope_boundary(grad_output, END_BACKWARD, ctx.scope_name), None


class _ExitScope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, scope_name):
        ctx.scope_name = scope_name
        return scope_boundary(input, END_FORWARD, scope_name)

    @staticmethod
    def backward(ctx, grad_output):
        return scope_boundary(grad_output, BEGIN_BACKWARD, ctx.scope_name), None


def enter_scope(input: torch.Tensor, scope_name: str) -> torch.Tensor:
    """Begins scope ``scope_name`` after ``input`` (its backward ends it)."""
    return _EnterScope.apply(input, scope_name)


def exit_scope(input: torch.Tensor, scope_name: str) -> torch.Tensor:
    """Ends scope ``scope_name`` after ``input`` (its backward begins it)."""
    return _ExitScope.apply(input, scope_name)


def sparse_matmul(
    input_values: torch.Tensor, input_indices: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """Matmul of a sparse input (values at ``input_indices`` of the sparse dim) with a dense
    weight, returning the output values at the same indices.

    Shapes: input_values (..., M, b, N), input_indices (..., M, b), weight (K, B, N);
    output (..., M, b, K).
    """
    if weight.size(1) >= 2**16:
        raise CstorchNotImplementedError("sparse_matmul requires `input_indices` to fit in uint16.")
    dense_shape = (*input_values.shape[:-2], weight.shape[-2], input_values.shape[-1])
    index = input_indices.unsqueeze(-1).to(torch.int64)
    dense = torch.zeros(dense_shape, dtype=input_values.dtype, device=input_values.device)
    dense = dense.scatter(-2, index.broadcast_to(input_values.shape), input_values)
    output = torch.einsum("...mbn,kbn->...mbk", dense, weight)
    out_shape = (*input_values.shape[:-1], weight.shape[0])
    return torch.gather(output, -2, index.broadcast_to(out_shape))


def sparse_act_matmul(
    input_value: torch.Tensor,
    input_mask: torch.Tensor,
    weight: torch.Tensor,
    dense_capacity: Optional[int] = None,
) -> torch.Tensor:
    """``input_value @ weight.T`` with rows where ``input_mask`` is 0 zeroed.

    Shapes: input_value (..., M, N), input_mask (..., M), weight (K, N); output (..., M, K).
    """
    assert input_value.shape[:-1] == input_mask.shape, (
        f"Expected input_value and input_mask to have the same shape except for the last dim "
        f"of input_value; got {tuple(input_value.shape)} and {tuple(input_mask.shape)}."
    )
    output = torch.einsum("...mn,kn->...mk", input_value, weight)
    return output * input_mask.unsqueeze(-1).to(output.dtype)


def bias_add(input_value: torch.Tensor, bias: torch.Tensor, dim: int) -> torch.Tensor:
    """``input_value`` plus the 1-D ``bias`` broadcast along dimension ``dim``."""
    assert bias.dim() == 1, f"Expected a 1D bias, got shape {tuple(bias.shape)}."
    assert input_value.dim() >= 2, f"Expected a >= 2D input, got {tuple(input_value.shape)}."
    assert 0 <= dim < input_value.dim(), f"`dim` must be in [0, {input_value.dim()}), got {dim}."
    assert bias.shape[0] == input_value.shape[dim], (
        f"Expected bias.shape[0] == input_value.shape[{dim}]; got {tuple(bias.shape)} and "
        f"{tuple(input_value.shape)}."
    )
    shape = [1] * input_value.dim()
    shape[dim] = bias.shape[0]
    return input_value + bias.view(shape)


def matmul(
    weight: torch.Tensor, input_value: torch.Tensor, weight_transposed: torch.Tensor = None
) -> torch.Tensor:
    """``weight @ input_value`` for (Ho, Hi) x (Hi, S); ``weight_transposed`` (the kernel's
    backward operand) is only checked."""
    assert weight.dim() == 2, f"Expected a 2D weight, got {tuple(weight.shape)}."
    assert input_value.dim() == 2, f"Expected a 2D input, got {tuple(input_value.shape)}."
    assert weight.shape[1] == input_value.shape[0], (
        f"Expected weight.shape[1] == input_value.shape[0]; got {tuple(weight.shape)} and "
        f"{tuple(input_value.shape)}."
    )
    if weight_transposed is not None:
        assert weight_transposed.shape == weight.t().shape, (
            "Expected weight_transposed to have the transposed shape of weight."
        )
    return torch.matmul(weight, input_value)


def ranged_matmul(
    weight: torch.Tensor,
    input_value: torch.Tensor,
    num_cols: torch.Tensor,
    weight_transposed: torch.Tensor = None,
) -> torch.Tensor:
    """``input_value @ weight.T`` for (B, S, Hi) inputs. The CSX kernel only computes the first
    ``num_cols[b]`` rows of batch b (the rest is undefined); the fallback computes them all."""
    assert weight.dim() == 2, f"Expected a 2D weight, got {tuple(weight.shape)}."
    assert input_value.dim() == 3, f"Expected a 3D input, got {tuple(input_value.shape)}."
    assert weight.shape[1] == input_value.shape[2], (
        f"Expected weight.shape[1] == input_value.shape[2]; got {tuple(weight.shape)} and "
        f"{tuple(input_value.shape)}."
    )
    assert num_cols.dim() == 1, f"Expected a 1D num_cols, got {tuple(num_cols.shape)}."
    if weight_transposed is not None:
        assert weight_transposed.shape == weight.t().shape, (
            "Expected weight_transposed to have the transposed shape of weight."
        )
    return torch.einsum("...mn,kn->...mk", input_value, weight)


def conditional_arange(
    mask: torch.Tensor, start: torch.Tensor, step: torch.Tensor, dtype: torch.dtype = None
) -> torch.Tensor:
    """Along the last axis, ``start, start+step, ...`` at positions where ``mask`` is 1 and -1
    where it is 0 (e.g. mask [0,1,1,0,1], start 0, step 1 → [-1,0,1,-1,2])."""
    assert start.dim() == 0, f"Expected a 0D start, got {tuple(start.shape)}."
    assert step.dim() == 0, f"Expected a 0D step, got {tuple(step.shape)}."
    mask = mask.bool()
    scaled = start + step * (torch.cumsum(mask, dim=-1) - 1)
    result = torch.where(mask, scaled, torch.full_like(scaled, -1))
    return result if dtype is None else result.to(dtype)


def nth_order_statistic(input: torch.Tensor, k: int, dimension: int) -> torch.Tensor:
    """An int16 mask of ``input``'s shape with 1 at the top ``k`` elements along
    ``dimension``."""
    _, indices = input.topk(k, dim=dimension)
    return torch.zeros_like(input, dtype=torch.int16).scatter(
        dimension, indices, torch.ones_like(indices, dtype=torch.int16)
    )


class _Unbind(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input):
        return tuple(torch.unbind(input, dim=0))

    @staticmethod
    def backward(ctx, *grads):
        return torch.stack(grads, dim=0)


def unbind(tensor: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """The slices of ``tensor`` along its first dimension."""
    return _Unbind.apply(tensor)
