"""Half-precision convolutions are autocast's (issue 31): on a CPU, the forward with its bias
and both gradients of bf16 operands are the exact result rounded once to bf16 after an fp32
accumulation, and the lowered gradient convolutions take bf16 operands, as the forward does,
instead of fp32 ones.

The judge is the exact result (float64, from the same bf16 values), not torch's bf16 output
bit for bit: torch's oneDNN kernels sum in an order that depends on the CPU's instruction set
(with AVX512_BF16 fewer of its forward outputs equal an fp32 sum rounded once), and its CPU
gradient kernels round partial sums to bf16 (torch 2.13 on a CPU without AVX-512: up to about
four bf16 roundings of the terms' magnitude, hundreds of steps where the terms cancel), so a
comparison with torch depends on the machine and the torch build (issue 49, item 6). An fp32
sum of ``k`` exact products (a bf16 product is exact in fp32) is within
``k * 2**-24 / (1 - k * 2**-24)`` of the sum of their magnitudes in any order, and one
rounding adds at most half a bf16 step: the engine must stay within that. torch's result is
held to the same exact result with its kernels' allowance (eight bf16 roundings of the
magnitude, 1.6% of it: a wrong convolution is off by the magnitude itself), as the op-coverage
gate judges float32 against float64."""

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
    "conv2d_groups_dilation": (
        (4, 8, 11, 10),
        (12, 4, 3, 3),
        [1, 1],
        [2, 2],
        [2, 2],
        False,
        [0, 0],
        2,
    ),
    "conv1d_depthwise": ((4, 8, 20), (16, 1, 3), [1], [1], [1], False, [0], 8),
    "conv3d": (
        (2, 4, 6, 7, 6),
        (6, 4, 3, 3, 3),
        [1, 2, 1],
        [1, 1, 1],
        [1, 1, 1],
        False,
        [0, 0, 0],
        1,
    ),
    "conv_transpose2d": ((4, 8, 6, 7), (8, 6, 3, 3), [2, 2], [1, 1], [1, 1], True, [1, 1], 2),
}


def _bf16(*shape):
    return torch.randn(*shape).bfloat16()


def _jax(t):
    return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)


def _torch(a):
    return torch.from_numpy(np.array(a.astype(jnp.float32)))


def _bf16_step(value: torch.Tensor) -> torch.Tensor:
    """The spacing of bfloat16 numbers at ``|value|`` (8 significant bits; float64)."""
    _, exponent = torch.frexp(value.abs())
    return torch.ldexp(torch.ones_like(value), exponent - 8)


def _accumulation(terms, magnitude):
    """How far an fp32 sum of ``terms`` exact products may be from their exact sum."""
    return terms * 2.0**-24 / (1 - terms * 2.0**-24) * magnitude


def _assert_within(name, result, exact, bound, what):
    error = (result.double() - exact).abs()
    worst = int((error - bound).argmax())
    assert (error <= bound).all(), (
        f"{name}: {int((error > bound).sum())} of {error.numel()} elements are farther from "
        f"the exact result than {what}; the worst is {result.flatten()[worst].item()!r} for "
        f"{exact.flatten()[worst].item()!r}"
    )


def _assert_rounded_once(name, result, exact, magnitude, terms):
    """``result`` (bf16) is an fp32 sum of at most ``terms`` exact products whose magnitudes
    sum to ``magnitude``, in any order, rounded once to bf16."""
    step = _bf16_step(torch.maximum(result.double().abs(), exact.abs()))
    _assert_within(
        name,
        result,
        exact,
        0.5 * step + _accumulation(terms, magnitude),
        "one rounding of an fp32 sum",
    )


def _assert_torchs_kernel(name, result, exact, magnitude, terms, roundings=8):
    """torch's bf16 kernel: the exact result up to ``roundings`` bf16 roundings of partial
    sums (each at most half a step of the magnitude, ``2**-9``) and the one of its output."""
    step = _bf16_step(torch.maximum(result.double().abs(), exact.abs()))
    bound = 0.5 * step + _accumulation(terms, magnitude) + roundings * 2.0**-9 * magnitude
    _assert_within(name, result, exact, bound, f"{roundings} bf16 roundings of the magnitude")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.slow
def test_bf16_convolution_and_its_gradients_are_rounded_once_on_cpu(variant):
    x_shape, w_shape, *args = VARIANTS[variant]
    torch.manual_seed(0)
    (
        x,
        w,
    ) = _bf16(*x_shape), _bf16(*w_shape)
    out_channels = w_shape[1] * args[-1] if args[3] else w_shape[0]
    bias = _bf16(out_channels)
    eager = aten.convolution(x, w, bias, *args)
    grad = _bf16(*eager.shape)
    eager_grads = aten.convolution_backward(grad, x, w, [out_channels], *args, [True] * 3)
    with lowering_for(Target("cpu")):
        ours = jax.jit(lambda x, w, b: aten_convolution(x, w, b, *args))(
            _jax(x), _jax(w), _jax(bias)
        )
        ours_grads = jax.jit(
            lambda g, x, w: aten_convolution_backward(g, x, w, [out_channels], *args, [True] * 3)
        )(_jax(grad), _jax(x), _jax(w))
    # The exact results (float64 holds every sum of these bf16 products exactly enough) and
    # the sums of the magnitudes of their terms; an output element sums at most one product
    # per element of its largest operand, and the forward adds the bias.
    wide = [t.double() for t in (x, w, bias, grad)]
    exact = aten.convolution(*wide[:3], *args)
    magnitude = aten.convolution(*[t.abs() for t in wide[:3]], *args)
    exact_grads = aten.convolution_backward(wide[3], *wide[:2], [out_channels], *args, [True] * 3)
    magnitude_grads = aten.convolution_backward(
        *[t.abs() for t in (wide[3], *wide[:2])], [out_channels], *args, [True] * 3
    )
    terms = max(x.numel(), w.numel(), grad.numel()) + 1
    _assert_rounded_once("forward", _torch(ours), exact, magnitude, terms)
    _assert_torchs_kernel("torch's forward", eager, exact, magnitude, terms)
    for name, mine, theirs, want, size in zip(
        ("input", "weight", "bias"), ours_grads, eager_grads, exact_grads, magnitude_grads
    ):
        assert mine.dtype == jnp.bfloat16, name
        _assert_rounded_once(f"{name} gradient", _torch(mine), want, size, terms)
        _assert_torchs_kernel(f"torch's {name} gradient", theirs, want, size, terms)


@pytest.mark.parametrize("platform, accumulate", [("cpu", np.float32), ("cuda", None)])
def test_gradient_convolutions_take_half_operands(platform, accumulate):
    """Both gradient convolutions in bf16, accumulating as the platform's forward does (an fp32
    request on a CPU, cuDNN's own fp32 accumulation on a GPU)."""
    x, w, g = (jnp.ones(s, jnp.bfloat16) for s in ((2, 4, 8, 8), (6, 4, 3, 3), (2, 6, 8, 8)))
    with lowering_for(Target(platform)):
        jaxpr = jax.make_jaxpr(
            lambda g, x, w: aten_convolution_backward(
                g, x, w, [6], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False]
            )
        )(g, x, w)
    convs = [e for e in jaxpr.eqns if e.primitive.name == "conv_general_dilated"]
    assert len(convs) >= 2
    for eqn in convs:
        assert [v.aval.dtype for v in eqn.invars] == [jnp.bfloat16] * 2
        assert eqn.params["preferred_element_type"] == accumulate
