"""Half-precision matrix products with a bias (``addmm``: a Linear with a bias; ``baddbmm``,
``addmv``) round once, as torch's CPU GEMMs do: the bias joins the fp32 accumulator, then the
sum is rounded to bf16. Adding the bias after rounding the product rounded twice (about a third
of a Linear's bf16 outputs differed from eager torch's)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jax_backend.ops.linalg import aten_addmm, aten_addmv, aten_baddbmm
from jax_backend.target import Target, lowering_for

aten = torch.ops.aten


def _jax(t):
    return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)


def _torch(a):
    return torch.from_numpy(np.array(a.astype(jnp.float32)))


CASES = {
    "addmm": (aten_addmm, aten.addmm, ((64,), (48, 96), (96, 64)), {}),
    "addmm_scaled": (
        aten_addmm,
        aten.addmm,
        ((48, 64), (48, 96), (96, 64)),
        {"beta": 0.5, "alpha": 2.0},
    ),
    "baddbmm": (aten_baddbmm, aten.baddbmm, ((4, 24, 32), (4, 24, 40), (4, 40, 32)), {}),
    "addmv": (aten_addmv, aten.addmv, ((48,), (48, 96), (96,)), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bf16_product_with_bias_rounds_once_as_torch_on_cpu(case):
    ours_fn, torch_fn, shapes, scale = CASES[case]
    torch.manual_seed(0)
    args = [torch.randn(*s).bfloat16() for s in shapes]
    eager = torch_fn(*args, **scale).float()
    with lowering_for(Target("cpu")):
        ours = jax.jit(lambda *a: ours_fn(*a, **scale))(*map(_jax, args))
    assert ours.dtype == jnp.bfloat16
    ours = _torch(ours)
    # Equal, up to one bf16 step on a rare element (torch sums in its own order).
    step = torch.finfo(torch.bfloat16).eps * eager.abs().clamp_min(1e-3)
    assert ((ours - eager).abs() <= step).all()
    assert (ours == eager).double().mean() >= 0.995


def test_fp32_addmm_is_unchanged():
    torch.manual_seed(0)
    bias, a, b = torch.randn(16), torch.randn(8, 32), torch.randn(32, 16)
    with lowering_for(Target("cpu")):
        ours = jax.jit(aten_addmm)(*(jnp.asarray(t.numpy()) for t in (bias, a, b)))
    assert ours.dtype == jnp.float32
    np.testing.assert_allclose(
        np.asarray(ours), torch.addmm(bias, a, b).numpy(), rtol=1e-6, atol=1e-6
    )
