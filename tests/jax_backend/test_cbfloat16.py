"""cbfloat16 (1 sign, 6 exponent, 9 mantissa bits) emulated in float32: the rounding, bit
for bit against a numpy reference written from the format's definition, and a step traced
under the cbfloat16 policy against the same rounding applied to float32 torch."""

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from jax_backend import cbfloat16


def reference_round(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even onto the cbfloat16 grid, from frexp: a number with exponent E
    (2**E <= |x| < 2**(E+1)) has spacing 2**(max(E, -30) - 9); past the largest finite value
    (2 - 2**-9) * 2**31 it is infinite. float64 arithmetic, so every step is exact."""
    x = x.astype(np.float64)
    out = x.copy()
    finite = np.isfinite(x) & (x != 0)
    _, e = np.frexp(x[finite])
    exponent = np.maximum(e - 1, -30)
    spacing = np.ldexp(1.0, exponent - 9)
    rounded = np.round(x[finite] / spacing) * spacing  # np.round: ties to even
    rounded[np.abs(rounded) > (2 - 2.0**-9) * 2.0**31] = np.inf
    out[finite] = np.copysign(rounded, x[finite])
    return out.astype(np.float32)


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _edge_values():
    grid = []
    for e in range(-40, 33):  # every binade, its ties and neighbours
        base = 2.0**e
        step = 2.0 ** (max(e, -30) - 9)
        for k in (0, 1, 2, 3, 255, 510, 511):
            v = base + k * step
            grid += [v, v + step / 2, v + step / 4, v + 3 * step / 4]
    grid += [
        cbfloat16.MAX,
        cbfloat16.MAX + 2.0**21,
        cbfloat16.MAX + 2.0**21 - 256,
        2.0**32,
        65504.0,
        65520.0,
        3.4e38,
        1e-45,
        2.0**-39,
        2.0**-40,
        3 * 2.0**-41,
    ]
    values = np.array(grid, np.float64)
    return np.concatenate([values, -values]).astype(np.float32)


@pytest.mark.slow
def test_rounding_is_bitwise_the_reference():
    rng = np.random.default_rng(0)
    patterns = rng.integers(0, 2**32, size=400_000, dtype=np.uint64).astype(np.uint32)
    random_values = patterns.view(np.float32)
    random_values = random_values[np.isfinite(random_values)]
    for values in (_edge_values(), random_values, rng.normal(0, 1e3, 100_000).astype(np.float32)):
        got = np.asarray(cbfloat16.round_to_cbfloat16(values))
        want = reference_round(values)
        mismatch = np.flatnonzero(_bits(got) != _bits(want))
        assert mismatch.size == 0, [(values[i], got[i], want[i]) for i in mismatch[:5]]


def test_rounding_keeps_inf_nan_and_signed_zero():
    got = np.asarray(
        cbfloat16.round_to_cbfloat16(np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32))
    )
    assert np.isposinf(got[0]) and np.isneginf(got[1]) and np.isnan(got[2])
    assert _bits(got[3]) == 0 and _bits(got[4]) == 0x80000000


def test_rounding_inside_jit_after_a_huge_constant_multiply():
    """A mask times ``finfo(float32).min`` (the Model Zoo 2.2 GPT-2's attention mask), rounded
    inside a jitted program: XLA folds the two constant multiplies into one whose constant is
    inf, which once turned the mask's zeros into NaN (a NaN loss at the first step on CSX)."""
    import jax

    mask = np.array([0.0, 1.0, 0.5, 0.0], np.float32)
    huge = np.float32(np.finfo(np.float32).min)
    got = np.asarray(jax.jit(lambda b: cbfloat16.round_to_cbfloat16(b * huge))(mask))
    want = reference_round(mask * huge)  # numpy: -0 where the mask is 0, else past MAX: -inf
    assert _bits(got).tolist() == _bits(want).tolist(), got


def test_the_format():
    assert cbfloat16.MAX == 4290772992.0
    assert cbfloat16.round_to_cbfloat16(np.float32(2.0**31)) == 2.0**31  # the initial scale
    assert cbfloat16.round_to_cbfloat16(np.float32(1 + 2.0**-9)) == 1 + 2.0**-9
    assert cbfloat16.round_to_cbfloat16(np.float32(1 + 2.0**-10)) == 1.0  # tie to even


@pytest.fixture
def cbfloat16_backend():
    cstorch.backend._reset_for_tests()
    cstorch.amp.set_half_dtype("cbfloat16")
    yield cstorch.backend("CPU")
    cstorch.backend._reset_for_tests()
    cstorch.amp.enable_mixed_precision(False)
    cstorch.amp.set_half_dtype("float16")
    cstorch.amp.enable_mixed_precision(False)


def _cb(t: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(reference_round(t.detach().numpy()))


def test_a_step_under_the_policy_holds_every_half_value_as_cbfloat16(cbfloat16_backend):
    """Linear -> relu -> Linear under autocast: the inputs of each matmul are rounded to
    cbfloat16, the products are float32 sums rounded to cbfloat16. The activations exceed
    float16's range (65504) and stay finite, as cbfloat16's do."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    compiled = cstorch.compile(model, cbfloat16_backend)

    @cstorch.trace
    def forward(x):
        return compiled(x).float()

    x = torch.randn(5, 8) * 3e5
    got = forward(x)
    w1, b1 = model[0].weight.detach(), model[0].bias.detach()
    w2, b2 = model[2].weight.detach(), model[2].bias.detach()
    hidden = _cb(_cb(x) @ _cb(w1).T + _cb(b1))  # addmm: one rounding of the fused result
    hidden = torch.relu(hidden)
    want = _cb(hidden @ _cb(w2).T + _cb(b2))
    assert torch.isfinite(got).all() and got.abs().max() > 65504
    torch.testing.assert_close(got, want, rtol=2e-6, atol=0)
