"""The ops the capture keeps whole (``capture.WHOLE_OPS``): the backward ops of layer norm,
the embedding, GELU and log-softmax, the negative log-likelihood forward and backward, and
the optimizers' lerp, addcmul and addcdiv.

torch's table would decompose them; the capture keeps them as one node each and their own
lowerings run. Each is compared here with eager torch, forward and gradients, over the
options that change its maths (weights, ignored and repeated classes, padding and frequency
scaling, the two GELUs, both branches of lerp, unbatched inputs, bfloat16), and the capture
is checked to keep them whole, so that these comparisons exercise the lowerings and not
torch's decompositions.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from jax_backend import capture_step
from jax_backend.capture import WHOLE_OPS
from tests.jax_backend.test_ops import Case, _float, _inputs, check, run_engine

aten = torch.ops.aten


def _classes(*shape, n, extra=()):
    """Class indices in [0, n), with the ``extra`` values written over the first entries."""

    def make():
        t = torch.randint(0, n, shape)
        flat = t.view(-1)
        for k, value in enumerate(extra):
            flat[k] = value
        return t

    return make


CASES = [
    # ---------------------------------------------------------------- negative log-likelihood
    *[
        Case(
            f"nll_loss_{reduction}",
            lambda x, t, reduction=reduction: F.nll_loss(x, t, reduction=reduction),
            _inputs(_float(7, 5, grad=True), _classes(7, n=5)),
            grad=True,
        )
        for reduction in ("mean", "sum", "none")
    ],
    *[
        Case(
            f"nll_loss_weight_ignore_{reduction}",
            lambda x, t, w, reduction=reduction: F.nll_loss(
                x, t, weight=w, ignore_index=2, reduction=reduction
            ),
            _inputs(_float(9, 6, grad=True), _classes(9, n=6, extra=(2, 2, 5)), _float(6, low=0.1)),
            grad=True,
        )
        for reduction in ("mean", "sum", "none")
    ],
    Case(
        "nll_loss_unbatched",
        lambda x, t: F.nll_loss(x, t),
        _inputs(_float(5, grad=True), lambda: torch.tensor(3)),
        grad=True,
    ),
    Case(
        "nll_loss_unbatched_weight_none",
        lambda x, t, w: F.nll_loss(x, t, weight=w, reduction="none"),
        _inputs(_float(5, grad=True), lambda: torch.tensor(4), _float(5, low=0.1)),
        grad=True,
    ),
    Case(  # every row ignored: torch's mean is 0 / 0
        "nll_loss_all_ignored_mean",
        lambda x, t: F.nll_loss(x, t, ignore_index=1),
        _inputs(_float(3, 4, grad=True), lambda: torch.tensor([1, 1, 1])),
        grad=True,
    ),
    Case(
        "cross_entropy_weight_ignore",
        lambda x, t, w: F.cross_entropy(x, t, weight=w, ignore_index=0),
        _inputs(_float(16, 11, grad=True), _classes(16, n=11, extra=(0, 0)), _float(11, low=0.1)),
        grad=True,
    ),
    Case(
        "cross_entropy_bf16",
        lambda x, t: F.cross_entropy(x, t),
        _inputs(_float(8, 10, grad=True, dtype=torch.bfloat16), _classes(8, n=10)),
        grad=True,
        rtol=1e-2,
        atol=1e-2,
    ),
    # -------------------------------------------------------------------------------- GELU
    Case(
        "gelu_none_grad",
        lambda x: F.gelu(x),
        _inputs(_float(4, 33, low=-6.0, high=6.0, grad=True)),
        grad=True,
    ),
    Case(  # within |x| < 4: beyond, XLA's tanh rounds to 1 where torch's does not (both GELUs)
        "gelu_tanh_grad",
        lambda x: F.gelu(x, approximate="tanh"),
        _inputs(_float(4, 33, low=-4.0, high=4.0, grad=True)),
        grad=True,
    ),
    *[
        Case(
            f"gelu_{approximate}_bf16",
            lambda x, approximate=approximate: F.gelu(x, approximate=approximate),
            _inputs(_float(4, 33, low=-6.0, high=6.0, grad=True, dtype=torch.bfloat16)),
            grad=True,
            rtol=1e-2,
            atol=1e-2,
        )
        for approximate in ("none", "tanh")
    ],
    # -------------------------------------------------------------------------- layer norm
    Case(
        "layer_norm_last_axis",
        lambda x, w, b: F.layer_norm(x, (16,), w, b, eps=1e-6),
        _inputs(_float(2, 8, 16, grad=True), _float(16, grad=True), _float(16, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "layer_norm_no_affine",
        lambda x: F.layer_norm(x, (3, 7)),
        _inputs(_float(5, 3, 7, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "layer_norm_weight_only",
        lambda x, w: F.layer_norm(x, (12,), w),
        _inputs(_float(6, 12, grad=True), _float(12, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    # --------------------------------------------------------------------------- embedding
    Case(
        "embedding_repeated_indices",
        lambda w, i: F.embedding(i, w),
        _inputs(_float(7, 4, grad=True), lambda: torch.tensor([[6, 0, 6, 6], [2, 0, 1, 6]])),
        grad=True,
    ),
    Case(
        "embedding_scale_grad_by_freq",
        lambda w, i: F.embedding(i, w, padding_idx=0, scale_grad_by_freq=True),
        _inputs(_float(7, 4, grad=True), lambda: torch.tensor([[6, 0, 6, 6], [2, 0, 1, 6]])),
        grad=True,
    ),
    Case(
        "embedding_negative_padding_idx",
        lambda w, i: F.embedding(i, w, padding_idx=-1),
        _inputs(_float(5, 3, grad=True), lambda: torch.tensor([4, 1, 4, 0])),
        grad=True,
    ),
    # ---------------------------------------------------------- the optimizers' ternary ops
    Case(  # weights on both sides of 0.5 (the formula switches there), negative and above 1
        "lerp_tensor_weight",
        lambda x, e, w: torch.lerp(x, e, w),
        _inputs(
            _float(6, 5, grad=True),
            _float(6, 5, grad=True),
            lambda: (
                torch.tensor([-0.5, 0.0, 0.1, 0.49, 0.5, 0.9, 1.0, 1.7]).repeat(4)[:30].view(6, 5)
            ),
        ),
        grad=True,
    ),
    *[
        Case(
            f"lerp_scalar_{weight}",
            lambda x, e, weight=weight: torch.lerp(x, e, weight),
            _inputs(_float(4, 7, grad=True), _float(4, 7, grad=True)),
            grad=True,
        )
        for weight in (0.1, 0.999, -0.3)
    ],
    Case(
        "lerp_bf16",
        lambda x, e: torch.lerp(x, e, 0.1),
        _inputs(_float(64, dtype=torch.bfloat16), _float(64, dtype=torch.bfloat16)),
        rtol=0,
        atol=0,
    ),
    Case(
        "addcmul_value_broadcast",
        lambda x, a, b: torch.addcmul(x, a, b, value=-0.25),
        _inputs(_float(3, 4, grad=True), _float(4, grad=True), _float(3, 1, grad=True)),
        grad=True,
    ),
    Case(
        "addcmul_int",
        lambda x, a, b: torch.addcmul(x, a, b, value=3),
        _inputs(
            lambda: torch.randint(-9, 9, (5,)),
            lambda: torch.randint(-9, 9, (5,)),
            lambda: torch.randint(-9, 9, (5,)),
        ),
    ),
    Case(
        "addcdiv_value",
        lambda x, a, b: torch.addcdiv(x, a, b, value=0.01),
        _inputs(_float(3, 4, grad=True), _float(3, 4, grad=True), _float(3, 4, low=0.5, grad=True)),
        grad=True,
    ),
    Case(
        "addcmul_addcdiv_bf16",
        lambda x, a, b: (torch.addcmul(x, a, b, value=0.5), torch.addcdiv(x, a, b, value=2.0)),
        _inputs(
            _float(64, dtype=torch.bfloat16),
            _float(64, dtype=torch.bfloat16),
            _float(64, low=0.5, dtype=torch.bfloat16),
        ),
        rtol=0,
        atol=0,
    ),
    # ------------------------------------------------------------------------- log-softmax
    Case(
        "log_softmax_middle_axis",
        lambda x: F.log_softmax(x, 1),
        _inputs(_float(3, 6, 4, grad=True)),
        grad=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lowering_matches_eager(case):
    check(case)


def _step(x, t, w, i, ln_w, ln_b):
    h = F.embedding(i, w, padding_idx=0)
    h = F.gelu(F.layer_norm(h, (4,), ln_w, ln_b))
    logits = h.sum(-1).reshape(2, 3)
    loss = F.cross_entropy(logits, t) + F.nll_loss(F.log_softmax(x, -1), t, reduction="sum")
    grads = torch.autograd.grad(loss, [x, w, ln_w])
    w2 = torch.lerp(w, grads[1], 0.1).lerp_(w, torch.full_like(w, 0.3))
    w2 = torch.addcdiv(torch.addcmul(w2, w, grads[1]), w, w.abs() + 1)
    return *grads, w2


def _functional(op):
    name = op._schema.name.split("::")[-1]
    return getattr(getattr(aten, name.rstrip("_")), op._overloadname) if name.endswith("_") else op


def test_capture_keeps_them_whole():
    """Without this, the comparisons above would test torch's decompositions."""
    inputs = [
        torch.randn(2, 3, requires_grad=True),
        torch.tensor([0, 2]),
        torch.randn(5, 4, requires_grad=True),
        torch.tensor([[1, 0, 4], [2, 3, 1]]),
        torch.randn(4, requires_grad=True),
        torch.randn(4),
    ]
    graph = capture_step(_step, [], inputs).graph.graph
    targets = {node.target for node in graph.nodes if node.op == "call_function"}
    functional = {_functional(op) for op in WHOLE_OPS}  # (in-place forms are functionalized)
    assert functional <= targets, functional - targets
    assert aten.where.self not in targets  # (what a decomposed lerp is made of)
    assert aten.scatter.value not in targets and aten.gather.default not in targets


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_nll_loss_class_out_of_range_gives_nan(reduction):
    """Eager torch stops on a class outside [0, C) ("Target 7 is out of bounds"); a compiled
    step cannot stop, so the loss of such a row and its gradient are NaN, never a number."""
    x = torch.randn(3, 5, requires_grad=True)
    t = torch.tensor([1, 7, 2])
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        F.nll_loss(x, t, reduction=reduction)

    def step(x, t):
        loss = F.nll_loss(x, t, reduction=reduction)
        return loss, torch.autograd.grad(loss.sum(), [x])[0]

    loss, grad = run_engine(step, [x, t])
    loss, grad = loss.numpy(), grad.numpy()
    if reduction == "none":
        assert np.isnan(loss[1]) and np.isfinite(loss[[0, 2]]).all()
        assert np.isnan(grad[1]).all() and np.isfinite(grad[[0, 2]]).all()
        assert grad[0, 1] == -1.0 and grad[2, 2] == -1.0
    else:
        assert np.isnan(loss)
    assert jax.numpy.isnan(jax.numpy.asarray(grad)).any()


def test_half_embedding_gradient_is_summed_in_float32():
    """512 bfloat16 gradients into one row: summed in float32 and rounded once they are the
    float32 sum to one bfloat16 rounding (eager torch's CPU kernel sums in bfloat16 and
    lands several roundings away; torch's decomposition, which the capture used before,
    sums in float32)."""
    torch.manual_seed(0)
    weight = torch.randn(3, 4).bfloat16().requires_grad_()
    indices = torch.zeros(512, dtype=torch.long)
    cotangent = torch.randn(512, 4).bfloat16()

    def step(w, i, g):
        return torch.autograd.grad(F.embedding(i, w), [w], [g])[0]

    (grad,) = run_engine(step, [weight, indices, cotangent])
    exact = cotangent.float().sum(0)
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs())) - 7)
    assert grad.dtype == torch.bfloat16
    assert ((grad[0].float() - exact).abs() <= ulp).all(), (grad[0], exact)
    assert (grad[1:] == 0).all()
    eager = step(weight, indices, cotangent)[0].float()
    assert ((eager - exact).abs() > ulp).any()  # what summing in bfloat16 would give
