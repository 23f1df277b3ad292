"""Random ops inside a captured step draw from the program's JAX PRNG key.

A program takes a per-step seed and derives its PRNG key from it. Draws must be reproducible
for one seed, different (and uncorrelated) for different seeds, and follow torch's
distributions. The statistical
bounds are loose (>= 5 standard deviations, or chi-square far in the tail), so these tests do
not flake; a wrong distribution misses them by far more.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from jax_backend import Program, capture_step, dtypes

N = 200_000  # draws for moment tests


def compile_step(fn, *inputs):
    program = Program(capture_step(fn, [], list(inputs)))
    assert program.uses_rng
    return program


def run(program, *inputs, seed=0):
    _, outputs = program([], [dtypes.tensor_to_array(x) for x in inputs], seed)
    return [np.asarray(o) for o in outputs]


def draw(fn, *inputs, seed=0):
    return run(compile_step(fn, *inputs), *inputs, seed=seed)


def assert_mean_var(sample, mean, var, sigmas=6.0):
    sample = np.asarray(sample, np.float64).ravel()
    n = sample.size
    se_mean = math.sqrt(var / n)
    assert abs(sample.mean() - mean) < sigmas * se_mean, (sample.mean(), mean)
    # Standard error of the sample variance ~ var * sqrt(2 / n) (normal), looser in general.
    assert abs(sample.var() - var) < sigmas * var * math.sqrt(3.0 / n), (sample.var(), var)


def chi_square_ok(counts, expected):
    """Chi-square statistic below a loose bound: mean k-1 plus 8 standard deviations."""
    counts, expected = np.asarray(counts, np.float64), np.asarray(expected, np.float64)
    stat = float(np.sum((counts - expected) ** 2 / expected))
    dof = len(counts) - 1
    return stat < dof + 8 * math.sqrt(2 * dof), stat


# ------------------------------------------------------------------------ keys and streams
@pytest.mark.slow
def test_same_seed_reproduces_and_different_seeds_differ():
    program = compile_step(lambda x: torch.rand(1000) + x, torch.zeros(()))
    x = torch.zeros(())
    a = run(program, x, seed=1)
    b = run(program, x, seed=1)
    c = run(program, x, seed=2)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])


@pytest.mark.slow
def test_consecutive_seeds_give_unrelated_streams():
    program = compile_step(lambda x: torch.randn(1000) + x, torch.zeros(()))
    x = torch.zeros(())
    first, second = run(program, x, seed=3), run(program, x, seed=4)
    assert abs(np.corrcoef(first[0], second[0])[0, 1]) < 0.15


@pytest.mark.slow
def test_two_random_ops_in_one_step_are_independent():
    a, b = draw(lambda x: (torch.rand(1000) + x, torch.rand(1000) + x), torch.zeros(()))
    assert not np.array_equal(a, b)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.15


@pytest.mark.slow
def test_no_fixed_key_in_lowerings():
    """Every random lowering takes its key from the program: draws follow the seed."""

    def step(x):
        return (
            torch.rand(64) + x,
            torch.randn(64),
            torch.randint(0, 1000, (64,)),
            torch.randperm(64),
            torch.bernoulli(torch.full((64,), 0.5)),
            torch.multinomial(torch.ones(64), 8),
            torch.empty(64).exponential_(),
            torch.empty(64).normal_(),
            torch.empty(64).uniform_(),
        )

    program = compile_step(step, torch.zeros(()))
    a = run(program, torch.zeros(()), seed=10)
    b = run(program, torch.zeros(()), seed=11)
    for x, y in zip(a, b):
        assert not np.array_equal(x, y)


# ------------------------------------------------------------------------- distributions
def test_rand_uniform_moments_and_range():
    (sample,) = draw(lambda x: torch.rand(N) + x, torch.zeros(()))
    assert sample.dtype == np.float32
    assert sample.min() >= 0.0 and sample.max() < 1.0
    assert_mean_var(sample, 0.5, 1.0 / 12.0)


@pytest.mark.slow
def test_randn_moments():
    (sample,) = draw(lambda x: torch.randn(N) + x, torch.zeros(()))
    assert_mean_var(sample, 0.0, 1.0)


@pytest.mark.slow
def test_randn_like_keeps_dtype_and_shape():
    (sample,) = draw(lambda x: torch.randn_like(x), torch.zeros(4, 5, dtype=torch.float64))
    assert sample.shape == (4, 5) and sample.dtype == np.float64


@pytest.mark.slow
def test_uniform_and_normal_in_place_parameters():
    def step(x):
        return torch.empty(N).uniform_(-2.0, 4.0) + x, torch.empty(N).normal_(3.0, 0.5) + x

    uniform, normal = draw(step, torch.zeros(()))
    assert uniform.min() >= -2.0 and uniform.max() < 4.0
    assert_mean_var(uniform, 1.0, 36.0 / 12.0)
    assert_mean_var(normal, 3.0, 0.25)


@pytest.mark.slow
def test_exponential_moments():
    (sample,) = draw(lambda x: torch.empty(N).exponential_(2.0) + x, torch.zeros(()))
    assert sample.min() >= 0.0
    assert_mean_var(sample, 0.5, 0.25, sigmas=8.0)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.slow
def test_bernoulli_rate(p):
    (sample,) = draw(lambda probs: torch.bernoulli(probs), torch.full((N,), p))
    assert set(np.unique(sample)) <= {0.0, 1.0}
    assert_mean_var(sample, p, p * (1 - p))


@pytest.mark.slow
def test_bernoulli_per_element_probabilities():
    probs = torch.tensor([0.0, 1.0, 0.25]).repeat(N // 3)
    (sample,) = draw(lambda q: torch.bernoulli(q), probs)
    sample = sample.reshape(-1, 3)
    assert np.all(sample[:, 0] == 0) and np.all(sample[:, 1] == 1)
    assert_mean_var(sample[:, 2], 0.25, 0.25 * 0.75)


@pytest.mark.parametrize("p", [0.2, 0.5])
@pytest.mark.slow
def test_dropout_keep_rate_and_scaling(p):
    x = torch.ones(N)
    (out,) = draw(lambda t: torch.nn.functional.dropout(t, p, training=True), x)
    kept = out != 0
    assert_mean_var(kept.astype(np.float64), 1 - p, p * (1 - p))
    np.testing.assert_allclose(out[kept], 1.0 / (1.0 - p), rtol=1e-6)


def test_dropout_eval_is_identity():
    x = torch.randn(100)
    captured = capture_step(lambda t: torch.nn.functional.dropout(t, 0.5, training=False), [], [x])
    _, outputs = Program(captured)([], [dtypes.tensor_to_array(x)], 0)
    np.testing.assert_array_equal(np.asarray(outputs[0]), x.numpy())


@pytest.mark.slow
def test_dropout_backward_uses_the_forward_mask():
    x = torch.randn(10_000, requires_grad=True)

    def step(t):
        out = torch.nn.functional.dropout(t, 0.4, training=True)
        (grad,) = torch.autograd.grad(out.sum(), [t])
        return out, grad

    out, grad = draw(step, x)
    kept = out != 0
    np.testing.assert_allclose(grad[kept], 1.0 / 0.6, rtol=1e-6)
    assert np.all(grad[~kept] == 0)


@pytest.mark.slow
def test_randint_range_and_uniformity():
    low, high = -3, 7
    (sample,) = draw(
        lambda x: torch.randint(low, high, (N,)) + x, torch.zeros((), dtype=torch.int64)
    )
    assert sample.dtype == np.int64
    assert sample.min() == low and sample.max() == high - 1
    counts = np.bincount(sample - low, minlength=high - low)
    ok, stat = chi_square_ok(counts, np.full(high - low, N / (high - low)))
    assert ok, stat


@pytest.mark.slow
def test_randint_dtype_argument():
    (sample,) = draw(
        lambda x: torch.randint(0, 5, (1000,), dtype=torch.int32) + x,
        torch.zeros((), dtype=torch.int32),
    )
    assert sample.dtype == np.int32 and sample.min() >= 0 and sample.max() < 5


@pytest.mark.slow
def test_log_normal_and_cauchy_and_geometric():
    def step(x):
        return (
            torch.empty(N).log_normal_(0.5, 0.25) + x,
            torch.empty(N).cauchy_(1.0, 2.0) + x,
            torch.empty(N).geometric_(0.25) + x,
        )

    log_normal, cauchy, geometric = draw(step, torch.zeros(()))
    assert_mean_var(np.log(log_normal), 0.5, 0.0625)
    # Cauchy has no moments: its quartiles are median -+ sigma.
    q1, q2, q3 = np.quantile(cauchy, [0.25, 0.5, 0.75])
    assert abs(q2 - 1.0) < 0.05 and abs(q1 + 1.0) < 0.08 and abs(q3 - 3.0) < 0.08
    assert geometric.min() == 1.0 and np.all(geometric == np.round(geometric))
    assert_mean_var(geometric, 4.0, 0.75 / 0.0625)


@pytest.mark.slow
def test_randperm_is_a_permutation():
    program = compile_step(lambda x: torch.randperm(50) + x, torch.zeros((), dtype=torch.int64))
    perms = [run(program, torch.zeros((), dtype=torch.int64), seed=s)[0] for s in range(5)]
    for perm in perms:
        assert perm.dtype == np.int64
        np.testing.assert_array_equal(np.sort(perm), np.arange(50))
    assert len({tuple(p) for p in perms}) == 5


@pytest.mark.slow
def test_randperm_positions_are_uniform():
    n, reps = 5, 4000
    program = compile_step(
        lambda x: torch.stack([torch.randperm(n) for _ in range(40)]) + x,
        torch.zeros((), dtype=torch.int64),
    )
    first = []
    for seed in range(reps // 40):
        (perms,) = run(program, torch.zeros((), dtype=torch.int64), seed=seed)
        first.extend(perms[:, 0])
    ok, stat = chi_square_ok(np.bincount(first, minlength=n), np.full(n, len(first) / n))
    assert ok, stat


@pytest.mark.slow
def test_multinomial_with_replacement_frequencies():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    (sample,) = draw(lambda p: torch.multinomial(p, N, replacement=True), probs)
    assert sample.shape == (N,) and sample.dtype == np.int64
    ok, stat = chi_square_ok(np.bincount(sample, minlength=4), probs.numpy() * N)
    assert ok, stat


@pytest.mark.slow
def test_multinomial_unnormalised_weights_and_batches():
    weights = torch.tensor([[1.0, 0.0, 3.0], [0.0, 5.0, 5.0]])
    (sample,) = draw(lambda w: torch.multinomial(w, 20_000, replacement=True), weights)
    assert sample.shape == (2, 20_000)
    assert not np.any(sample[0] == 1) and not np.any(sample[1] == 0)
    ok, stat = chi_square_ok(np.bincount(sample[0], minlength=3)[[0, 2]], [5_000, 15_000])
    assert ok, stat


@pytest.mark.slow
def test_multinomial_without_replacement():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4]).repeat(20_000, 1)
    (sample,) = draw(lambda p: torch.multinomial(p, 2, replacement=False), probs)
    assert sample.shape == (20_000, 2)
    assert np.all(sample[:, 0] != sample[:, 1])
    # The first draw follows the probabilities; the second is conditional on the first.
    ok, stat = chi_square_ok(np.bincount(sample[:, 0], minlength=4), probs[0].numpy() * 20_000)
    assert ok, stat
    # P(second = j) = sum_i p_i * p_j / (1 - p_i) over i != j.
    p = probs[0].numpy().astype(np.float64)
    second = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(4) if i != j) for j in range(4)])
    ok, stat = chi_square_ok(np.bincount(sample[:, 1], minlength=4), second * 20_000)
    assert ok, stat


@pytest.mark.slow
def test_multinomial_all_categories_is_a_permutation():
    (sample,) = draw(lambda p: torch.multinomial(p, 6), torch.rand(100, 6) + 0.1)
    np.testing.assert_array_equal(np.sort(sample, axis=1), np.tile(np.arange(6), (100, 1)))
