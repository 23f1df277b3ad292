"""The engine's CPU embedding (``native_embedding.py``, ``native/embedding.cc``): the gather of
a float32 table and its gradient's scatter-add as native calls.
Their numbers against eager torch (equal: a gather copies, and each gradient row sums its
contributions in the order of the indices, as torch's CPU kernel does) and against XLA's
lowering (the same semantics outside the table: a row of NaN forward, nothing added backward);
the same bits on every run whatever the threads; where it is used: only in the engine's CPU
program, for a float32 table and integer indices, with the library built for the running
jaxlib. (A traced cstorch step with it: tests/cstorch/backend/test_cpu_native_ops.py.)"""

from __future__ import annotations

import dataclasses
import os

import jax
import jaxlib
import numpy as np
import pytest
import torch

from jax_backend import config, native_embedding
from jax_backend.jax_settings import engine_scope
from jax_backend.ops.indexing import aten_embedding, aten_embedding_dense_backward
from jax_backend.target import Target, lowering_for

NATIVE, XLA = Target("cpu", native_ops=frozenset({"embedding"})), Target("cpu")
# (rows, width, index shape, padding_idx, index dtype): a transformer's token table (gradient
# rows shared between threads in several blocks), a 3-d index with padding, no indices, a
# single row.
CASES = [
    (1024, 256, (16, 128), -1, np.int64),
    (50, 7, (3, 4, 5), 3, np.int32),
    (5, 3, (0,), -1, np.int64),
    (1, 1, (6,), 0, np.int64),
]


def _gather():
    """A jit of its own: jit keys its trace cache by the function, not by the target."""
    return jax.jit(lambda table, indices: aten_embedding(table, indices))


def _engine(table, indices, grad, rows, padding_idx, lowering):
    with engine_scope(), lowering_for(lowering):
        out = _gather()(table, indices)
        summed = jax.jit(
            lambda g, i: aten_embedding_dense_backward(g, i, rows, padding_idx, False)
        )(grad, indices)
        text = _gather().lower(table, indices).as_text()
    return np.asarray(out), np.asarray(summed), text


def test_the_library_is_built_for_this_jaxlib():
    """`make native` builds it where the tests run (no skip: a broken build fails here)."""
    assert (
        os.path.basename(native_embedding.LIBRARY.path())
        == f"_embedding-jaxlib{jaxlib.__version__}.so"
    )
    assert native_embedding.LIBRARY.unavailable() is None


@pytest.mark.parametrize("rows, width, shape, padding_idx, dtype", CASES)
def test_gather_and_gradient_equal_eager_torch(rows, width, shape, padding_idx, dtype):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((rows, width)).astype(np.float32)
    indices = rng.integers(0, rows, shape).astype(dtype)
    grad = rng.standard_normal(shape + (width,)).astype(np.float32)
    index = torch.from_numpy(indices).long()
    expected = torch.nn.functional.embedding(index, torch.from_numpy(table)).numpy()
    expected_grad = torch.ops.aten.embedding_dense_backward(
        torch.from_numpy(grad), index, rows, padding_idx, False
    ).numpy()
    out, summed, text = _engine(table, indices, grad, rows, padding_idx, NATIVE)
    assert "cstorch_embedding" in text
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(summed, expected_grad)  # the same sums in the same order
    xla_out, xla_summed, xla_text = _engine(table, indices, grad, rows, padding_idx, XLA)
    assert "cstorch_embedding" not in xla_text
    np.testing.assert_array_equal(out, xla_out)
    np.testing.assert_allclose(summed, xla_summed, rtol=1e-6, atol=1e-6)


def test_indices_outside_the_table_behave_as_xlas_lowering():
    """Forward: [-rows, 0) counts from the end, anything else outside is a row of NaN (eager
    torch raises instead); backward: anything outside [0, rows) adds nothing."""
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    indices = np.array([0, 3, 4, -1, -4, -5], np.int64)
    grad = np.ones((6, 3), np.float32)
    native = _engine(table, indices, grad, 4, -1, NATIVE)
    xla = _engine(table, indices, grad, 4, -1, XLA)
    np.testing.assert_array_equal(native[0], xla[0])  # NaN where XLA's has NaN
    assert np.isnan(native[0][[2, 5]]).all() and not np.isnan(native[0][[0, 1, 3, 4]]).any()
    np.testing.assert_array_equal(native[0][3], table[3])
    np.testing.assert_array_equal(native[1], xla[1])
    np.testing.assert_array_equal(native[1], [[1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1]])


def test_an_index_past_int32_is_outside_the_table():
    """An int64 index of 2**40 is a row of NaN and adds nothing (XLA's gather narrows it to
    int32 first and reads row 0)."""
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    indices = np.array([1, 2**40], np.int64)
    out, summed, _ = _engine(table, indices, np.ones((2, 3), np.float32), 4, -1, NATIVE)
    np.testing.assert_array_equal(out[0], table[1])
    assert np.isnan(out[1]).all()
    np.testing.assert_array_equal(summed, [[0, 0, 0], [1, 1, 1], [0, 0, 0], [0, 0, 0]])


def test_the_same_bits_on_every_run():
    """Repeated indices over many gradient rows, the table split between threads: each row
    sums in index order whichever thread has it."""
    rng = np.random.default_rng(1)
    indices = rng.integers(0, 64, (8192,)).astype(np.int64)
    grad = rng.standard_normal((8192, 512)).astype(np.float32)
    table = np.zeros((64, 512), np.float32)
    first = _engine(table, indices, grad, 64, -1, NATIVE)[1]
    expected = torch.ops.aten.embedding_dense_backward(
        torch.from_numpy(grad), torch.from_numpy(indices), 64, -1, False
    ).numpy()
    np.testing.assert_array_equal(first, expected)
    for _ in range(4):
        np.testing.assert_array_equal(_engine(table, indices, grad, 64, -1, NATIVE)[1], first)


def test_other_dtypes_and_frequency_scaling_keep_xlas_lowering():
    indices = np.array([1, 0, 1], np.int64)
    half = jax.numpy.ones((3, 4), jax.numpy.bfloat16)
    with engine_scope(), lowering_for(NATIVE):
        assert native_embedding.applies(np.ones((3, 4), np.float32), indices)
        assert not native_embedding.applies(half, indices)
        assert "cstorch_embedding" not in _gather().lower(half, indices).as_text()
        scaled = jax.jit(lambda g, i: aten_embedding_dense_backward(g, i, 3, -1, True))
        grad = np.ones((3, 4), np.float32)
        assert "cstorch_embedding" not in scaled.lower(grad, indices).as_text()
        np.testing.assert_array_equal(
            scaled(grad, indices),
            torch.ops.aten.embedding_dense_backward(
                torch.from_numpy(grad), torch.from_numpy(indices), 3, -1, True
            ).numpy(),
        )


# ------------------------------------------------------------------ where it is used
def test_wanted_only_for_the_engines_cpu_program(monkeypatch):
    assert config.cpu_embedding.default == "native"
    monkeypatch.delenv("CSTORCH_CPU_EMBEDDING", raising=False)
    assert native_embedding.wanted("cpu", None)
    assert not native_embedding.wanted("cuda", None)
    assert not native_embedding.wanted("cpu", object())  # a mesh of devices
    monkeypatch.setenv("CSTORCH_CPU_EMBEDDING", "xla")
    assert not native_embedding.wanted("cpu", None)
    monkeypatch.setenv("CSTORCH_CPU_EMBEDDING", "gather")  # only its two words
    with pytest.raises(config.SettingError, match="must be one of native, xla"):
        native_embedding.wanted("cpu", None)
    with lowering_for(Target("cpu")):
        assert not native_embedding.applies(np.ones((2, 2), np.float32), np.zeros(1, np.int64))


def test_without_the_library_xlas_kernels_run(monkeypatch):
    monkeypatch.delenv("CSTORCH_CPU_EMBEDDING", raising=False)
    missing = dataclasses.replace(native_embedding.LIBRARY, name="not_built")
    monkeypatch.setattr(native_embedding, "LIBRARY", missing)
    assert not native_embedding.wanted("cpu", None)
