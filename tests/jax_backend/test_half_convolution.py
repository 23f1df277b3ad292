"""Half-precision convolutions are autocast's (issue 31): on a CPU, the forward with its bias
and both gradients of bf16 operands give torch's CPU bf16 results (fp32 accumulation, one
rounding), and the lowered gradient convolutions take bf16 operands, as the forward does,
instead of fp32 ones."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jax_backend.ops.nn import aten_convolution, aten_convolution_backward
from jax_backend.target import Target, lowering_for

aten = torch.ops.aten

# (input shape, weight shape, stride, padding, dilation, transposed, output_padding, groups)
VARIANTS = {
    "conv2d_stride": ((8, 16, 12, 12), (32, 16, 3, 3), [2, 2], [1, 1], [1, 1], False, [0, 0], 1),
    "conv2d_groups_dilation": ((4, 8, 11, 10), (12, 4, 3, 3), [1, 1], [2, 2], [2, 2], False,
                               [0, 0], 2),
    "conv1d_depthwise": ((4, 8, 20), (16, 1, 3), [1], [1], [1], False, [0], 8),
    "conv3d": ((2, 4, 6, 7, 6), (6, 4, 3, 3, 3), [1, 2, 1], [1, 1, 1], [1, 1, 1], False,
               [0, 0, 0], 1),
    "conv_transpose2d": ((4, 8, 6, 7), (8, 6, 3, 3), [2, 2], [1, 1], [1, 1], True, [1, 1], 2),
}


def _bf16(*shape):
    return torch.randn(*shape).bfloat16()


def _jax(t):
    return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)


def _torch(a):
    return torch.from_numpy(np.array(a.astype(jnp.float32)))


def _assert_torchs_rounding(ours, eager):
    """Equal, up to one bf16 step on a rare element (torch's kernels sum in their own order)."""
    ours, eager = ours.float(), eager.float()
    step = torch.finfo(torch.bfloat16).eps * eager.abs().clamp_min(1e-3)
    assert ((ours - eager).abs() <= step).all()
    assert (ours == eager).double().mean() >= 0.999


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.slow
def test_bf16_convolution_and_its_gradients_match_torch_on_cpu(variant):
    x_shape, w_shape, *args = VARIANTS[variant]
    torch.manual_seed(0)
    x, w, = _bf16(*x_shape), _bf16(*w_shape)
    out_channels = w_shape[1] * args[-1] if args[3] else w_shape[0]
    bias = _bf16(out_channels)
    eager = aten.convolution(x, w, bias, *args)
    grad = _bf16(*eager.shape)
    eager_grads = aten.convolution_backward(grad, x, w, [out_channels], *args, [True] * 3)
    with lowering_for(Target("cpu")):
        ours = jax.jit(lambda x, w, b: aten_convolution(x, w, b, *args))(
            _jax(x), _jax(w), _jax(bias))
        ours_grads = jax.jit(lambda g, x, w: aten_convolution_backward(
            g, x, w, [out_channels], *args, [True] * 3))(_jax(grad), _jax(x), _jax(w))
    _assert_torchs_rounding(_torch(ours), eager)
    for name, mine, theirs in zip(("input", "weight", "bias"), ours_grads, eager_grads):
        assert mine.dtype == jnp.bfloat16, name
        _assert_torchs_rounding(_torch(mine), theirs)


@pytest.mark.parametrize("platform, accumulate", [("cpu", np.float32), ("cuda", None)])
def test_gradient_convolutions_take_half_operands(platform, accumulate):
    """Both gradient convolutions in bf16, accumulating as the platform's forward does (an fp32
    request on a CPU, cuDNN's own fp32 accumulation on a GPU)."""
    x, w, g = (jnp.ones(s, jnp.bfloat16) for s in ((2, 4, 8, 8), (6, 4, 3, 3), (2, 6, 8, 8)))
    with lowering_for(Target(platform)):
        jaxpr = jax.make_jaxpr(lambda g, x, w: aten_convolution_backward(
            g, x, w, [6], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False]))(g, x, w)
    convs = [e for e in jaxpr.eqns if e.primitive.name == "conv_general_dilated"]
    assert len(convs) >= 2
    for eqn in convs:
        assert [v.aval.dtype for v in eqn.invars] == [jnp.bfloat16] * 2
        assert eqn.params["preferred_element_type"] == accumulate
