"""jax_backend.sparsity: the mask maths against numpy, under jit with traced counts, and
the balanced-group examples of cerebras-pytorch 2.10's documentation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_backend import sparsity
from tests.lanes import marked_cases


def _numpy_topk(score, k):
    """Keeps the k largest of each row (ties: lower index first)."""
    order = np.argsort(-score, axis=-1, kind="stable")
    mask = np.zeros(score.shape, bool)
    np.put_along_axis(mask, order[..., :k], True, axis=-1)
    return mask


@pytest.mark.parametrize(
    "level",
    marked_cases(
        LEVELS := [0.0, 0.3, 0.5, 0.7, 0.99, 1.0], ids=map(str, LEVELS), slow={"0.0", "0.3"}
    ),
)
def test_topk_sparsity_counts_and_positions(level):
    score = np.random.default_rng(0).normal(size=(7, 13)).astype(np.float32)
    got = np.asarray(sparsity.mask_topk_sparsity(jnp.asarray(score), level))
    k = int(np.float32(1 - np.float32(level)) * np.float32(score.size))  # the reference's count
    np.testing.assert_array_equal(got.reshape(-1), _numpy_topk(score.reshape(1, -1), k)[0])


@pytest.mark.slow
def test_ties_keep_the_lower_index():
    got = sparsity.topk_rows(jnp.array([[1.0, 2.0, 2.0, 2.0, 0.0]]), 2)
    assert np.asarray(got).tolist() == [[False, True, True, False, False]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_topk_with_ties_signed_zeros_and_infinities(dtype):
    rng = np.random.default_rng(3)
    topk = jax.jit(sparsity.topk_rows)
    values = [-2.0, -1.0, -0.0, 0.0, 0.5, 1.0, 3.0, np.inf, -np.inf]
    for _ in range(20):
        score = rng.choice(values, size=(3, 17)).astype(dtype)
        k = int(rng.integers(0, 18))
        want = _numpy_topk(score + dtype(0.0), k)  # -0.0 ties with 0.0, as in torch.topk
        np.testing.assert_array_equal(np.asarray(topk(jnp.asarray(score), k)), want)


@pytest.mark.slow
def test_reference_documentation_examples():
    score = jnp.array([[1.0, 2.0], [0.0, -1.0]])
    assert np.asarray(sparsity.mask_topk_sparsity(score, 0.25)).tolist() == [
        [True, True],
        [True, False],
    ]
    assert np.asarray(sparsity.mask_topk_sparsity(score, 0.75)).tolist() == [
        [False, True],
        [False, False],
    ]
    assert np.asarray(sparsity.mask_topk_sparsity(score, 0.5, ("out", 2))).tolist() == [
        [False, True],
        [True, False],
    ]
    score = jnp.array([[1.0, 0.0], [2.0, -1.0]])
    assert np.asarray(sparsity.mask_topk_sparsity(score, 0.5)).tolist() == [
        [True, False],
        [True, False],
    ]
    assert np.asarray(sparsity.mask_topk_sparsity(score, 0.5, ("in", 2))).tolist() == [
        [False, True],
        [True, False],
    ]


@pytest.mark.slow
def test_one_program_for_every_sparsity_level():
    traces = []

    @jax.jit
    def masks(score, level):
        traces.append(1)
        return sparsity.mask_topk_sparsity(score, level)

    score = jnp.arange(20.0)
    counts = [int(masks(score, jnp.float32(s)).sum()) for s in (0.1, 0.5, 0.9)]
    assert counts == [18, 10, 2] and len(traces) == 1


@pytest.mark.slow
def test_drop_and_grow_against_numpy():
    rng = np.random.default_rng(1)
    weight = rng.normal(size=(8, 6)).astype(np.float32)
    mask = _numpy_topk(np.abs(weight).reshape(1, -1), 24)[0].reshape(8, 6)
    dropped, kept = sparsity.mask_drop_minimum(jnp.abs(weight), mask, 0.25)
    assert int(kept) == 18
    expected = _numpy_topk(np.where(mask, np.abs(weight), 0).reshape(1, -1), 18)[0]
    np.testing.assert_array_equal(np.asarray(dropped).reshape(-1), expected)

    grow_score = rng.uniform(size=(8, 6)).astype(np.float32)
    grown = np.asarray(sparsity.mask_grow_maximum(grow_score, dropped, 0.5, kept))
    candidates = np.where(np.asarray(dropped), -np.inf, grow_score).reshape(1, -1)
    expected = np.asarray(dropped).reshape(-1) | _numpy_topk(candidates, 24 - 18)[0]
    np.testing.assert_array_equal(grown.reshape(-1), expected)
    assert grown.sum() == 24
    # a mask already denser than the target is kept as it is
    full = np.ones((8, 6), bool)
    np.testing.assert_array_equal(sparsity.mask_grow_maximum(grow_score, full, 0.5), full)


@pytest.mark.slow
def test_balanced_rigl_update_keeps_every_group_balanced():
    rng = np.random.default_rng(2)
    weight = jnp.asarray(rng.normal(size=(8, 6)).astype(np.float32))
    grad = jnp.asarray(rng.normal(size=(8, 6)).astype(np.float32))
    for shaper, blocks in (
        (("out", 4), lambda m: m.reshape(4, -1)),
        (("in", 3), lambda m: m.T.reshape(3, -1)),
    ):
        mask = sparsity.mask_topk_sparsity(jnp.abs(weight), 0.5, shaper)
        counts = np.asarray(blocks(mask)).sum(1)
        assert (counts == blocks(mask).shape[1] // 2).all()
        new = sparsity.rigl_update(weight, mask, 0.5, 0.5, grad, True, shaper)
        np.testing.assert_array_equal(np.asarray(blocks(new)).sum(1), counts)
        assert not np.array_equal(np.asarray(new), np.asarray(mask))
        same = sparsity.rigl_update(weight, mask, 0.5, 0.5, grad, False, shaper)
        np.testing.assert_array_equal(np.asarray(same), np.asarray(mask))


@pytest.mark.slow
def test_gmp_update_and_pruning_helpers():
    weight = jnp.array([[0.1, -3.0], [2.0, 0.5]])
    mask = jnp.ones((2, 2), bool)
    new = sparsity.gmp_update(weight, mask, 0.5, jnp.bool_(True))
    assert np.asarray(new).tolist() == [[False, True], [True, False]]
    assert np.asarray(sparsity.prune(weight, new)).tolist() == [[0.0, -3.0], [2.0, 0.0]]
    grad = jnp.array([[jnp.nan, 1.0], [2.0, jnp.inf]])
    assert np.asarray(sparsity.masked_gradient(grad, new)).tolist() == [[0.0, 1.0], [2.0, 0.0]]


def test_bad_shapers_are_named():
    with pytest.raises(ValueError, match="not a multiple of 4"):
        sparsity.mask_topk_sparsity(jnp.ones((6, 2)), 0.5, ("out", 4))
    with pytest.raises(ValueError, match="not a multiple of 3"):
        sparsity.check_shaper(("out", 3), (8, 6))
    with pytest.raises(ValueError, match="2-D weight"):
        sparsity.check_shaper(("in", 2), (8,))
    with pytest.raises(ValueError, match="'out', groups"):
        sparsity.check_shaper(("rows", 2), (8, 6))


def test_torch_cpu_ties_keep_what_torch_topk_keeps():
    """Among equal scores (the zeros of pruned weights) ``ties="torch_cpu"`` keeps exactly
    the positions ``torch.topk`` on CPU keeps, inside jit, for traced k."""
    import jax
    import numpy as np
    import torch

    sparsity_module = sparsity.mask_topk_sparsity
    rng = np.random.default_rng(0)
    score = np.abs(rng.normal(size=(3, 200))).astype(np.float32)
    score[rng.random(score.shape) < 0.6] = 0.0
    for level in (0.2, 0.5, 0.55, 0.7):
        got = np.asarray(
            jax.jit(lambda s, lvl: sparsity_module(s, lvl, ("out", 3), ties="torch_cpu"))(
                score.reshape(-1), np.float32(level)
            )
        ).reshape(3, 200)
        k = int(np.float32(1 - np.float32(level)) * np.float32(200))
        indices = torch.topk(torch.from_numpy(score), k, dim=-1).indices
        want = torch.zeros(score.shape, dtype=torch.bool).scatter_(-1, indices, True).numpy()
        np.testing.assert_array_equal(got, want)
