"""Sums over leading axes on the CPU (``ops.reduction``): where they keep many elements (a
position embedding's gradient, summed over the batch) XLA's library reduction is 20-60x
slower than a product with a ones vector, so the CPU target lowers them as that product.
The numbers are eager torch's (float32 sums of the same terms, in another order); other
targets and other sums keep XLA's reduction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jax_backend.ops import reduction
from jax_backend.target import Target
from tests.lowered import lowered

CPU = Target("cpu")

# (input shape, dims, keepdim, lowered as a product on the CPU?)
CASES = [
    ((16, 128, 256), [0], False, True),  # a learned position embedding's gradient
    ((4, 16, 64, 64), [0, 1], True, True),
    ((2, 3, 4096), [-3, -2], False, True),  # negative dims name the same leading axes
    ((16, 128, 256), [0, 1], False, False),  # keeps 256: XLA's reduction is fast there
    ((16, 128, 256), [1], False, False),  # not a leading axis
    ((16, 128, 256), [0, 2], False, False),
]


def _lowered(fn, inputs, target):
    """(the program's result, its StableHLO text) of ``fn`` lowered for ``target``."""
    program, args = lowered(fn, inputs, target)
    return program(args)[0], program.lower(args).as_text()


@pytest.mark.parametrize("shape, dims, keepdim, as_product", CASES)
def test_sum_over_leading_axes_equals_torch(shape, dims, keepdim, as_product):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    expected = x.sum(dims, keepdim=keepdim)
    for target in (CPU, Target()):
        out, text = _lowered(lambda t: t.sum(dims, keepdim=keepdim), [x], target)
        assert out.shape == tuple(expected.shape)
        # float32 sums of the same terms in another order: within a few units of rounding
        # of the sum of the terms' magnitudes (XLA's own order differs between its versions)
        bound = 1e-6 * x.abs().sum(dims, keepdim=keepdim).numpy()
        assert (np.abs(np.asarray(out) - expected.numpy()) <= bound).all(), target
        product = "dot_general" in text
        assert product == (as_product and target == CPU), (target, text[-600:])


def test_float64_and_integer_sums():
    """float64 is summed as a product too, in float64; an integer sum keeps XLA's reduction
    (torch accumulates it in int64, exactly)."""
    torch.manual_seed(0)
    x = torch.randn(8, 64, 128, dtype=torch.float64)
    out, text = _lowered(lambda t: t.sum(0), [x], CPU)
    assert out.dtype == np.float64 and "dot_general" in text
    bound = 1e-14 * x.abs().sum(0).numpy()  # float64 rounding, whatever the kernel's order
    assert (np.abs(np.asarray(out) - x.sum(0).numpy()) <= bound).all()
    ints = torch.randint(-1000, 1000, (8, 64, 128), dtype=torch.int32)
    out, text = _lowered(lambda t: t.sum(0), [ints], CPU)
    assert "dot_general" not in text
    np.testing.assert_array_equal(np.asarray(out), ints.sum(0).numpy())


def test_empty_leading_axis_sums_to_zeros():
    x = torch.zeros(0, 64, 128)
    out, text = _lowered(lambda t: t.sum(0), [x], CPU)
    assert "dot_general" in text
    np.testing.assert_array_equal(np.asarray(out), np.zeros((64, 128), np.float32))


def test_the_threshold_is_the_kept_size():
    """Below ``WIDE_OUTER_SUM`` kept elements the sum stays a reduction."""
    kept = reduction.WIDE_OUTER_SUM
    x = torch.ones(3, kept)
    assert "dot_general" in _lowered(lambda t: t.sum(0), [x], CPU)[1]
    y = torch.ones(3, kept - 1)
    assert "dot_general" not in _lowered(lambda t: t.sum(0), [y], CPU)[1]
