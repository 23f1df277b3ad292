"""The engine's CPU classification loss (``native_loss.py``, ``native/loss.cc``): log-softmax over
the last dim, its backward, and the NLL's forward and backward with a mean or a sum, as native
calls on float32 rows.
Their numbers against eager torch in float64 (as close as XLA's lowerings and torch's own
float32 kernels), their special values against XLA's lowerings (NaN rows, ignored rows, classes
out of range), the same bits on every run whatever the threads; where they are used: only in
the engine's CPU program, for float32, with the library built for the running jaxlib. (A traced
cstorch step with them: tests/cstorch/backend/test_cpu_native_ops.py.)"""

from __future__ import annotations

import dataclasses
import os

import jax
import jaxlib
import numpy as np
import pytest
import torch

from jax_backend import config, native_loss
from jax_backend.jax_settings import engine_scope
from jax_backend.ops.nn import aten_nll_loss_backward, aten_nll_loss_forward
from jax_backend.ops.reduction import aten_log_softmax, aten_log_softmax_backward
from jax_backend.target import Target, lowering_for

NATIVE, XLA = Target("cpu", native_ops=frozenset({"loss"})), Target("cpu")
SHAPES = [(2048, 1024), (3, 5, 7), (40, 33), (1, 1), (0, 8)]


def _error(got, exact):
    """The largest error in units of the exact values' largest magnitude (at least 1)."""
    if got.size == 0:
        return 0.0
    return float(np.max(np.abs(got - exact)) / max(1.0, float(np.max(np.abs(exact)))))


def _log_softmax(x, g, lowering):
    """The lowerings' log-softmax over the last dim and its backward, each its own jit."""
    with engine_scope(), lowering_for(lowering):
        forward = jax.jit(lambda x: aten_log_softmax(x, -1))
        out = forward(x)
        grad = jax.jit(lambda g, o: aten_log_softmax_backward(g, o, -1, torch.float32))(g, out)
        text = forward.lower(x).as_text()
    return np.asarray(out), np.asarray(grad), text


def _torch_log_softmax(x, g, dtype):
    x, g = torch.from_numpy(x).to(dtype), torch.from_numpy(g).to(dtype)
    out = torch.ops.aten._log_softmax(x, -1, False)
    grad = torch.ops.aten._log_softmax_backward_data(g, out, -1, dtype)
    return out.double().numpy(), grad.double().numpy()


def test_the_library_is_built_for_this_jaxlib():
    """`make native` builds it where the tests run (no skip: a broken build fails here)."""
    assert os.path.basename(native_loss.LIBRARY.path()) == f"_loss-jaxlib{jaxlib.__version__}.so"
    assert native_loss.LIBRARY.unavailable() is None


@pytest.mark.parametrize("shape", SHAPES)
def test_log_softmax_and_its_backward_match_eager_torch(shape):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    exact = _torch_log_softmax(x, g, torch.float64)
    eager = _torch_log_softmax(x, g, torch.float32)
    out, grad, text = _log_softmax(x, g, NATIVE)
    xla_out, xla_grad, xla_text = _log_softmax(x, g, XLA)
    assert "cstorch_log_softmax" in text and "cstorch_log_softmax" not in xla_text
    for got, ref, other, torch32 in zip((out, grad), exact, (xla_out, xla_grad), eager):
        assert got.shape == ref.shape and got.dtype == np.float32
        assert _error(got, ref) <= 2e-6  # a few roundings of the largest term
        assert _error(got, ref) <= 4 * max(_error(other, ref), _error(torch32, ref)) + 1e-7


def test_log_softmax_special_values_as_xlas_lowering():
    """A row with NaN, with +inf, entirely -inf, with one -inf, and a row far from zero."""
    inf, nan = np.inf, np.nan
    x = np.array(
        [
            [0.0, nan, 1.0, 2.0],
            [0.0, inf, 1.0, 2.0],
            [-inf, -inf, -inf, -inf],
            [-inf, 0.0, 1.0, 2.0],
            [1e30, 1e30, -1e30, 0.0],
            [-200.0, 0.0, -90.0, -100.0],
        ],
        np.float32,
    )
    g = np.ones_like(x)
    out, grad, _ = _log_softmax(x, g, NATIVE)
    xla_out, xla_grad, _ = _log_softmax(x, g, XLA)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(xla_out))
    np.testing.assert_allclose(out, xla_out, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(np.isnan(grad), np.isnan(xla_grad))
    np.testing.assert_allclose(grad, xla_grad, rtol=1e-6, atol=1e-7)


def _nll(x, classes, weight, reduction, ignore_index, lowering):
    with engine_scope(), lowering_for(lowering):
        forward = jax.jit(lambda x, t, w: aten_nll_loss_forward(x, t, w, reduction, ignore_index))
        loss, total = forward(x, classes, weight)
        grad = jax.jit(
            lambda go, x, t, w, tw: aten_nll_loss_backward(go, x, t, w, reduction, ignore_index, tw)
        )(np.float32(1.5), x, classes, weight, total)
        text = forward.lower(x, classes, weight).as_text()
    return float(loss), float(total), np.asarray(grad), text


@pytest.mark.parametrize("reduction", [1, 2])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_nll_matches_eager_torch(reduction, weighted, dtype):
    rng = np.random.default_rng(1)
    n, c, ignore = 2048, 1024, 7
    x = rng.standard_normal((n, c)).astype(np.float32)
    classes = rng.integers(0, c, n).astype(dtype)
    classes[::50] = ignore  # ignored rows (class 7 is ignored everywhere)
    weight = rng.uniform(0.5, 2.0, c).astype(np.float32) if weighted else None
    xt, tt = torch.from_numpy(x).double().requires_grad_(), torch.from_numpy(classes).long()
    wt = None if weight is None else torch.from_numpy(weight).double()
    expected = torch.nn.functional.nll_loss(
        xt, tt, wt, ignore_index=ignore, reduction=("mean", "sum")[reduction - 1]
    )
    (expected * 1.5).backward()
    loss, total, grad, text = _nll(x, classes, weight, reduction, ignore, NATIVE)
    xla_loss, xla_total, xla_grad, xla_text = _nll(x, classes, weight, reduction, ignore, XLA)
    assert "cstorch_nll_loss" in text and "cstorch_nll_loss" not in xla_text
    np.testing.assert_allclose(loss, expected.item(), rtol=2e-6)
    # summed over the rows in the order of torch's CPU kernel: eager's float32 loss exactly
    eager32 = torch.nn.functional.nll_loss(
        torch.from_numpy(x),
        tt,
        None if weight is None else torch.from_numpy(weight),
        ignore_index=ignore,
        reduction=("mean", "sum")[reduction - 1],
    )
    assert loss == eager32.item()
    np.testing.assert_allclose(loss, xla_loss, rtol=2e-6)
    np.testing.assert_allclose(total, xla_total, rtol=1e-6)
    np.testing.assert_allclose(grad, xt.grad.numpy(), rtol=1e-6, atol=0)
    np.testing.assert_allclose(grad, xla_grad, rtol=1e-6, atol=0)


def test_nll_classes_out_of_range_are_nan_as_xlas_lowering():
    """Eager torch raises; a compiled step cannot, so that row's loss and gradient are NaN (a
    mean is NaN); an ignored row adds nothing."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for classes in (np.array([1, 9, -1]), np.array([1, -100, 2])):
        native = _nll(x, classes, None, 1, -100, NATIVE)
        xla = _nll(x, classes, None, 1, -100, XLA)
        np.testing.assert_array_equal(native[0], xla[0])
        np.testing.assert_array_equal(native[1], xla[1])
        np.testing.assert_array_equal(native[2], xla[2])


def test_the_same_bits_on_every_run():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4096, 512)) * 3).astype(np.float32)  # rows over many blocks
    classes = rng.integers(0, 512, 4096)
    first = _log_softmax(x, x, NATIVE)[:2] + _nll(x, classes, None, 1, -100, NATIVE)[:3]
    for _ in range(4):
        again = _log_softmax(x, x, NATIVE)[:2] + _nll(x, classes, None, 1, -100, NATIVE)[:3]
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)


def test_other_forms_keep_xlas_lowerings():
    x = np.ones((4, 6), np.float32)
    classes = np.array([0, 1, 2, 3])
    with engine_scope(), lowering_for(NATIVE):
        assert native_loss.log_softmax_applies(x, 1)
        assert not native_loss.log_softmax_applies(x, 0)  # not the last dim
        assert not native_loss.log_softmax_applies(x.astype(jax.numpy.bfloat16), 1)
        assert native_loss.nll_applies(x, classes, None, 1)
        assert not native_loss.nll_applies(x, classes, None, 0)  # reduction none
        assert not native_loss.nll_applies(x[0], classes[:1], None, 1)  # unbatched
        text = jax.jit(lambda x: aten_log_softmax(x, 0)).lower(x).as_text()
        assert "cstorch_log_softmax" not in text


# ------------------------------------------------------------------ where it is used
def test_wanted_only_for_the_engines_cpu_program(monkeypatch):
    assert config.cpu_loss.default == "native"
    monkeypatch.delenv("CSTORCH_CPU_LOSS", raising=False)
    assert native_loss.wanted("cpu", None)
    assert not native_loss.wanted("cuda", None)
    assert not native_loss.wanted("cpu", object())  # a mesh of devices
    monkeypatch.setenv("CSTORCH_CPU_LOSS", "xla")
    assert not native_loss.wanted("cpu", None)
    monkeypatch.setenv("CSTORCH_CPU_LOSS", "fused")  # only its two words
    with pytest.raises(config.SettingError, match="must be one of native, xla"):
        native_loss.wanted("cpu", None)
    with lowering_for(Target("cpu")):
        assert not native_loss.log_softmax_applies(np.ones((2, 2), np.float32), 1)


def test_without_the_library_xlas_kernels_run(monkeypatch):
    monkeypatch.delenv("CSTORCH_CPU_LOSS", raising=False)
    missing = dataclasses.replace(native_loss.LIBRARY, name="not_built")
    monkeypatch.setattr(native_loss, "LIBRARY", missing)
    assert not native_loss.wanted("cpu", None)
