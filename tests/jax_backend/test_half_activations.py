"""Activations of half-precision tensors (``ops.elementwise``): torch's kernels compute GELU,
ELU and the like in float32 and round the result once; a lowering that ran the formula in
bfloat16 rounded after every step, and 43% of a bfloat16 GELU's elements then differed from
eager torch's by a unit in the last place. Computed as torch does, the rare difference left is
in the last bit of a value near zero (XLA's erf and torch's differ there)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.lowered import lowered

F = torch.nn.functional
ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "elu": F.elu,
}


def _lowered(fn, x):
    program, args = lowered(fn, [x])
    (out,) = program(args)
    return np.asarray(out.astype(np.float32))


def _unit_in_last_place(values, dtype):
    """The spacing of ``dtype`` numbers at each of ``values`` (normal numbers)."""
    mantissa_bits = {torch.bfloat16: 7, torch.float16: 10}[dtype]
    exponent = np.floor(np.log2(np.maximum(np.abs(values), 1e-30)))
    return np.exp2(exponent - mantissa_bits)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_activation_rounds_once_as_torch(name, dtype):
    torch.manual_seed(0)
    x = (torch.randn(8192) * 3).to(dtype)
    fn = ACTIVATIONS[name]
    out, expected = _lowered(fn, x), fn(x).float().numpy()
    # One unit in the last place, or 1e-6 where the result is near zero: there GELU's
    # 1 + erf(x/√2) cancels, and XLA's erf and torch's differ in the tail.
    tolerance = np.maximum(_unit_in_last_place(expected, dtype), 1e-6)
    assert (np.abs(out - expected) <= tolerance).all(), (name, dtype)
    assert (out != expected).mean() < 0.1, (name, dtype, (out != expected).mean())


def test_float32_activation_is_unchanged_by_the_half_path():
    torch.manual_seed(0)
    x = torch.randn(8192) * 3
    np.testing.assert_allclose(_lowered(F.gelu, x), F.gelu(x).numpy(), rtol=1e-6, atol=1e-6)
