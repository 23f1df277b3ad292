"""The engine's CPU layer norm (``native_layer_norm.py``, ``native/layer_norm.cc``): the forward
and backward of a float32 layer norm as native calls, row by row.
Its numbers against eager torch in float64 (as close as XLA's lowering of the same maths, and
as eager torch's own float32 kernels); the same bits on every run whatever the threads; where
it is used: only in the engine's CPU program, for float32, with the library built for the
running jaxlib. (A traced cstorch step with it: tests/cstorch/backend/test_cpu_native_ops.py.)"""

from __future__ import annotations

import dataclasses
import os

import jax
import jaxlib
import numpy as np
import pytest
import torch

from jax_backend import config, native_layer_norm
from jax_backend.ops.normalization import (
    aten_native_layer_norm,
    aten_native_layer_norm_backward,
)
from jax_backend.target import Target, lowering_for

NATIVE, XLA = Target("cpu", native_ops=frozenset({"layer_norm"})), Target("cpu")
EPS = 1e-5
# (input shape, normalized shape): a transformer's activations (rows shared between threads
# in several blocks), two normalized dims, a row not a multiple of the library's 16 lanes,
# one element, no rows at all.
CASES = [
    ((16, 128, 256), (256,)),
    ((3, 5, 7), (5, 7)),
    ((40, 33), (33,)),
    ((1, 1), (1,)),
    ((0, 8), (8,)),
]


def _problem(shape, normalized, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)  # off-centre, wide
    g = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(normalized).astype(np.float32)
    b = rng.standard_normal(normalized).astype(np.float32)
    return x, g, w, b


def _torch(x, g, w, b, normalized, dtype):
    """Eager torch's forward and backward in ``dtype``: (out, mean, rstd, dx, dw, db)."""
    x, g = torch.from_numpy(x).to(dtype), torch.from_numpy(g).to(dtype)
    w = None if w is None else torch.from_numpy(w).to(dtype)
    b = None if b is None else torch.from_numpy(b).to(dtype)
    out, mean, rstd = torch.ops.aten.native_layer_norm(x, list(normalized), w, b, EPS)
    grads = torch.ops.aten.native_layer_norm_backward(
        g, x, list(normalized), mean, rstd, w, b, [True, w is not None, b is not None]
    )
    return [None if t is None else t.double().numpy() for t in (out, mean, rstd, *grads)]


def _engine(x, g, w, b, normalized, lowering, mask=(True, True, True)):
    """The lowerings' forward and backward, jitted for ``lowering``."""
    n = list(normalized)
    with lowering_for(lowering):
        out, mean, rstd = jax.jit(lambda x, w, b: aten_native_layer_norm(x, n, w, b, EPS))(x, w, b)
        grads = jax.jit(
            lambda g, x, m, r, w, b: aten_native_layer_norm_backward(g, x, n, m, r, w, b, mask)
        )(g, x, mean, rstd, w, b)
        text = jax.jit(lambda x, w, b: aten_native_layer_norm(x, n, w, b, EPS)).lower(x, w, b)
    return [None if a is None else np.asarray(a) for a in (out, mean, rstd, *grads)], text.as_text()


def _error(got, exact, scale):
    return 0.0 if got.size == 0 else float(np.max(np.abs(got - exact)) / scale)


def test_the_library_is_built_for_this_jaxlib():
    """`make native` builds it where the tests run (no skip: a broken build fails here)."""
    assert (
        os.path.basename(native_layer_norm.LIBRARY.path())
        == f"_layer_norm-jaxlib{jaxlib.__version__}.so"
    )
    assert native_layer_norm.LIBRARY.unavailable() is None


@pytest.mark.parametrize("shape, normalized", CASES)
def test_forward_and_backward_match_eager_torch(shape, normalized):
    x, g, w, b = _problem(shape, normalized)
    exact = _torch(x, g, w, b, normalized, torch.float64)
    torch32 = _torch(x, g, w, b, normalized, torch.float32)
    native, text = _engine(x, g, w, b, normalized, NATIVE)
    xla, xla_text = _engine(x, g, w, b, normalized, XLA)
    assert "cstorch_layer_norm" in text and "cstorch_layer_norm" not in xla_text
    rows = max(1, int(np.prod(shape[: len(shape) - len(normalized)])))
    names = ("out", "mean", "rstd", "grad_x", "grad_weight", "grad_bias")
    for name, got, ref, other, eager in zip(names, native, exact, xla, torch32):
        assert got.shape == ref.shape == other.shape, name
        assert got.dtype == np.float32, name
        scale = max(1.0, float(np.max(np.abs(ref), initial=0)))
        # float32 sums of a row (or, for the weight and bias, of a column over the rows):
        # a few roundings of each term's size
        bound = 1e-6 * (8 + (rows if name in ("grad_weight", "grad_bias") else 0) ** 0.5 * 4)
        assert _error(got, ref, scale) <= bound, name
        # and no further from the exact values than XLA's kernels or torch's own float32 ones
        worst = max(_error(other, ref, scale), _error(eager, ref, scale))
        assert _error(got, ref, scale) <= 4 * worst + 1e-7, name


@pytest.mark.parametrize("affine", ["weight", "bias", "neither"])
def test_an_absent_weight_or_bias(affine):
    shape, normalized = (24, 40), (40,)
    x, g, w, b = _problem(shape, normalized, seed=1)
    w = None if affine in ("bias", "neither") else w
    b = None if affine in ("weight", "neither") else b
    exact = _torch(x, g, w, b, normalized, torch.float64)
    native, text = _engine(
        x, g, w, b, normalized, NATIVE, mask=(True, w is not None, b is not None)
    )
    assert "cstorch_layer_norm" in text
    for got, ref in zip(native, exact):
        assert (got is None) == (ref is None)
        if got is not None:
            np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * max(1, np.abs(ref).max()))


def test_the_output_mask_drops_what_it_does_not_ask_for():
    x, g, w, b = _problem((10, 16), (16,), seed=2)
    native, _ = _engine(x, g, w, b, (16,), NATIVE, mask=(True, False, False))
    xla, _ = _engine(x, g, w, b, (16,), XLA, mask=(True, False, False))
    assert native[4] is None and native[5] is None and xla[4] is None and xla[5] is None
    np.testing.assert_allclose(native[3], xla[3], rtol=1e-5, atol=1e-6)


def test_the_same_bits_on_every_run():
    """The weight and bias gradients are summed over fixed blocks of rows in a fixed order, so
    which thread runs which block changes nothing."""
    x, g, w, b = _problem((4096, 64), (64,), seed=3)  # 64 blocks over the pool's threads
    first, _ = _engine(x, g, w, b, (64,), NATIVE)
    for _ in range(5):
        again, _ = _engine(x, g, w, b, (64,), NATIVE)
        for a, c in zip(first, again):
            np.testing.assert_array_equal(a, c)


def test_half_precision_keeps_xlas_lowering():
    x, g, w, b = _problem((8, 32), (32,), seed=4)
    x16 = jax.numpy.asarray(x, jax.numpy.bfloat16)
    with lowering_for(NATIVE):
        assert native_layer_norm.applies(x, w, b)
        assert not native_layer_norm.applies(x16, w, b)
        text = jax.jit(lambda x: aten_native_layer_norm(x, [32], w, b, EPS)).lower(x16).as_text()
    assert "cstorch_layer_norm" not in text


# ------------------------------------------------------------------ where it is used
def test_wanted_only_for_the_engines_cpu_program(monkeypatch):
    assert config.cpu_layer_norm.default == "native"
    monkeypatch.delenv("CSTORCH_CPU_LAYER_NORM", raising=False)
    assert native_layer_norm.wanted("cpu", None)
    assert not native_layer_norm.wanted("cuda", None)
    assert not native_layer_norm.wanted("cpu", object())  # a mesh of devices
    monkeypatch.setenv("CSTORCH_CPU_LAYER_NORM", "xla")
    assert not native_layer_norm.wanted("cpu", None)
    monkeypatch.setenv("CSTORCH_CPU_LAYER_NORM", "fused")  # only its two words
    with pytest.raises(config.SettingError, match="must be one of native, xla"):
        native_layer_norm.wanted("cpu", None)
    assert not Target().native_ops  # exports, pure_function, direct lowerings
    x = np.ones((2, 4), np.float32)
    with lowering_for(Target("cpu")):
        assert not native_layer_norm.applies(x)


def test_without_the_library_xlas_kernels_run(monkeypatch):
    monkeypatch.delenv("CSTORCH_CPU_LAYER_NORM", raising=False)
    missing = dataclasses.replace(native_layer_norm.LIBRARY, name="not_built")
    monkeypatch.setattr(native_layer_norm, "LIBRARY", missing)
    assert not native_layer_norm.wanted("cpu", None)
