"""max_pool's backward lowering where the windows tile the input (stride = kernel, no padding
or dilation: ``ops.pooling._tiled_max_pool_backward``, no scatter) against torch's own CPU
kernel: ties, NaN inputs, gradients of -0.0 and NaN, a remainder that no window covers,
ceil_mode's partial windows, 2-d and 3-d, bfloat16; and the scatter path for overlapping
windows beside it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jax_backend.jax_settings import engine_scope
from jax_backend.ops import pooling

aten = torch.ops.aten


def _case(shape, kernel, stride, ceil_mode, dtype):
    """(x, grad_output, indices, torch's input gradient) of one max_pool."""
    nd = len(kernel)
    g = torch.Generator().manual_seed(sum(shape) + sum(kernel))
    x = torch.randint(-3, 4, shape, generator=g).to(dtype)  # small integers: many ties
    x.view(-1)[::17] = float("nan")
    forward = aten.max_pool2d_with_indices if nd == 2 else aten.max_pool3d_with_indices
    backward = (
        aten.max_pool2d_with_indices_backward if nd == 2 else aten.max_pool3d_with_indices_backward
    )
    geometry = (list(kernel), list(stride), [0] * nd, [1] * nd, ceil_mode)
    out, indices = forward(x, *geometry)
    grad = torch.randn(out.shape, generator=g).to(dtype)
    grad.view(-1)[::5] = -0.0
    grad.view(-1)[3::11] = float("nan")
    return x, grad, indices, backward(grad, x, *geometry, indices)


def _lowered(x, grad, indices, kernel, stride, ceil_mode):
    nd = len(kernel)
    lowering = pooling.aten_max_pool2d_backward if nd == 2 else pooling.aten_max_pool3d_backward
    dtype = jnp.bfloat16 if x.dtype == torch.bfloat16 else jnp.float32

    def run(g, a, i):
        geometry = (kernel, stride, [0] * nd, [1] * nd, ceil_mode)
        return lowering(g.astype(dtype), a.astype(dtype), *geometry, i)

    with engine_scope():
        jitted = jax.jit(run)
        args = (grad.float().numpy(), x.float().numpy(), indices.numpy())
        result = jitted(*args)
        program = jitted.lower(*args).as_text()
    return torch.from_numpy(np.array(result.astype(jnp.float32))).to(x.dtype), program


CASES = [  # (shape, kernel, stride, ceil_mode)
    ((2, 3, 8, 8), (2, 2), (2, 2), False),
    ((2, 3, 9, 7), (2, 2), (2, 2), False),  # a row and a column in no window
    ((1, 2, 9, 7), (3, 2), (3, 2), True),  # ceil_mode: partial windows at the edges
    ((1, 2, 5, 3), (2, 4), (2, 4), True),  # a window wider than the input (ceil_mode)
    ((4, 5, 6), (3, 3), (3, 3), False),  # no batch dimension
    ((1, 2, 4, 6, 6), (2, 3, 2), (2, 3, 2), False),  # 3-d
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,kernel,stride,ceil_mode", CASES)
def test_tiled_windows_give_torchs_gradient_without_a_scatter(
    shape, kernel, stride, ceil_mode, dtype
):
    x, grad, indices, expected = _case(shape, kernel, stride, ceil_mode, dtype)
    got, program = _lowered(x, grad, indices, kernel, stride, ceil_mode)
    assert "scatter" not in program
    assert got.shape == expected.shape
    # Equal values (NaN where torch has NaN), and the sign of every zero as torch's sum left it.
    np.testing.assert_array_equal(got.float().numpy(), expected.float().numpy())
    numbers = ~expected.isnan()
    assert torch.equal(torch.signbit(got) & numbers, torch.signbit(expected) & numbers)
    assert torch.signbit(grad[grad == 0]).any()  # the case has -0.0 gradients to place


def test_overlapping_windows_keep_the_scatter_and_agree_with_torch():
    shape, kernel, stride = (2, 3, 8, 8), (3, 3), (2, 2)
    x, grad, indices, expected = _case(shape, kernel, stride, False, torch.float32)
    got, program = _lowered(x, grad, indices, kernel, stride, False)
    assert "scatter" in program
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)


FORWARD_CASES = CASES + [  # (shape, kernel, stride, ceil_mode), and padding / dilation below
    ((2, 3, 8, 8), (3, 3), (2, 2), False),  # overlapping windows
    ((2, 3, 9, 9), (3, 3), (2, 2), True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,kernel,stride,ceil_mode", FORWARD_CASES)
@pytest.mark.parametrize("padding,dilation", [(0, 1), (1, 1), (1, 2)])
def test_forward_gives_torchs_values_and_indices(
    shape, kernel, stride, ceil_mode, dtype, padding, dilation
):
    """The forward scans the kernel's offsets in order (``_max_pool_with_indices``): the
    first maximum among ties and the NaN torch's kernel picks, its value and flat index."""
    nd = len(kernel)
    if padding and min(kernel) < 2 * padding:
        padding = 0  # torch: padding at most half the kernel
    geometry = (list(kernel), list(stride), [padding] * nd, [dilation] * nd, ceil_mode)
    x, *_ = _case(shape, kernel, stride, ceil_mode, dtype)
    x.view(-1)[5::23] = float("-inf")
    x.view(-1)[7::29] = -0.0
    forward = aten.max_pool2d_with_indices if nd == 2 else aten.max_pool3d_with_indices
    lowering = (
        pooling.aten_max_pool2d_with_indices if nd == 2 else pooling.aten_max_pool3d_with_indices
    )
    expected, expected_indices = forward(x, *geometry)
    jax_dtype = jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
    with engine_scope():
        values, indices = jax.jit(lambda a: lowering(a.astype(jax_dtype), *geometry))(
            x.float().numpy()
        )
    got = torch.from_numpy(np.array(values.astype(jnp.float32)))
    np.testing.assert_array_equal(got.numpy(), expected.float().numpy())
    assert torch.equal(torch.signbit(got), torch.signbit(expected.float()))
    np.testing.assert_array_equal(np.asarray(indices), expected_indices.numpy())


def test_a_plane_int32_cannot_number_keeps_int64_indices():
    """The indices are computed in int32 where every window's start and offsets fit, else in
    int64 (traced on abstract arrays: nothing is allocated)."""

    def index_dtypes(side, kernel):
        x = jax.ShapeDtypeStruct((1, 1, side, side), jnp.bfloat16)
        forward = jax.make_jaxpr(lambda x: pooling.aten_max_pool2d_with_indices(x, kernel, kernel))(
            x
        )
        grad = jax.ShapeDtypeStruct(forward.out_avals[0].shape, jnp.bfloat16)
        index = jax.ShapeDtypeStruct(forward.out_avals[1].shape, jnp.int64)
        backward = jax.make_jaxpr(
            lambda g, x, i: pooling.aten_max_pool2d_backward(
                g, x, kernel, kernel, [0, 0], [1, 1], False, i
            )
        )(grad, x, index)
        return {
            str(v.aval.dtype)
            for jaxpr in (forward, backward)
            for e in jaxpr.eqns
            for v in e.outvars
            if jnp.issubdtype(v.aval.dtype, jnp.integer)
        }

    with engine_scope():
        assert "int32" in index_dtypes(64, [2, 2])
        assert "int32" not in index_dtypes(46_341, [2, 2])  # 46 341² > 2³¹
