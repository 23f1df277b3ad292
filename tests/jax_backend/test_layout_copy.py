"""The engine's layout copy (``ops/layout_copy.py``, ``native/layout_copy.cc``): the native
transpose that hands XLA's CPU bfloat16 dots the operand form they take. Its values against
numpy's transpose; the products that use it (``linalg.dot``'s ``aᵀ·b``, the attention's
backward) against float64 and eager torch, with no bfloat16 dot left that XLA widens; and
where it is used: only where the target says so, and only with the library built for the
running jaxlib (``make native``)."""

from __future__ import annotations

import dataclasses
import os
import re

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from jax_backend import dtypes
from jax_backend.ops import attention, layout_copy, linalg, torch_kernels
from jax_backend.target import Target, lowering_for

COPIES = Target("cpu", layout_copies=True)
CPU = Target("cpu")


def test_the_library_is_built_for_this_jaxlib():
    """`make native` builds it where the tests run (no skip: a broken build fails here), under
    the running jaxlib's version."""
    assert (
        os.path.basename(layout_copy.LIBRARY.path())
        == f"_layout_copy-jaxlib{jaxlib.__version__}.so"
    )
    assert layout_copy.LIBRARY.unavailable() is None


def test_a_library_built_before_a_target_was_added_is_unavailable():
    """A checkout updated without `make native` keeps a library that lacks a newer target
    (``cstorch_row_major_copy`` was added after ``cstorch_swap_last_two``): it is reported
    unavailable, naming the missing symbol, rather than half-registered and used."""
    newer = dataclasses.replace(
        layout_copy.LIBRARY,
        targets=layout_copy.LIBRARY.targets + (("cstorch_not_built", "CstorchNotBuilt"),),
    )
    why = newer.unavailable()
    assert why is not None and "CstorchNotBuilt" in why and "cannot be loaded" in why
    assert "make native" in why  # what to do about it


def _assert_no_widened_dot(text):
    """No bfloat16 dot widened, where this jaxlib's XLA keeps any in bfloat16 (0.10 does);
    where it widens them all (0.7, the compatibility leg) the engine does not copy."""
    if layout_copy.xla_keeps_bf16_dots():
        assert layout_copy.widened_dots(text) == 0, text
    else:
        assert "widens every bfloat16 dot" in layout_copy.unavailable()
        assert not layout_copy.wanted("cpu", None)


@pytest.mark.parametrize(
    "shape",
    [(2048, 256), (256, 2048), (64, 128, 128), (3, 13, 21), (9, 7), (1, 1), (2, 3, 8, 16)],
)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32, jnp.int32])
def test_swap_last_two_is_numpys_transpose(shape, dtype):
    # Every element distinct (bit patterns), the tiles' edges included.
    x = np.arange(np.prod(shape), dtype=np.int64).reshape(shape) % 30011
    x = jnp.asarray(x).astype(dtype)
    out = jax.jit(layout_copy.swap_last_two)(x)
    assert out.dtype == x.dtype
    assert np.array_equal(np.asarray(out), np.swapaxes(np.asarray(x), -1, -2))


def test_swap_last_two_refuses_other_element_sizes():
    with pytest.raises(Exception, match="2- or 4-byte"):
        jax.jit(layout_copy.swap_last_two)(jnp.ones((4, 3), jnp.float64)).block_until_ready()


# (lhs shape, rhs shape, contracting, batch): aᵀ·b forms, each operand the smaller once.
LEFT_ROW_CONTRACTIONS = {
    "weight_gradient_copy_lhs": ((96, 24), (96, 40), ((0,), (0,)), ((), ())),
    "weight_gradient_copy_rhs": ((96, 40), (96, 24), ((0,), (0,)), ((), ())),
    "batched": ((2, 3, 33, 17), (2, 3, 33, 20), ((2,), (2,)), ((0, 1), (0, 1))),
    "batched_rhs_transposed": ((3, 33, 17), (3, 20, 33), ((1,), (2,)), ((0,), (0,))),
}
# aᵀ·v with a vector (mv's input gradient, Aᵀ·g), shorter than a's rows: XLA widens a
# product with a vector whatever the layout, so none is copied.
LEFT_ROW_CONTRACTIONS_WITH_A_VECTOR = {
    "matrix_vector": ((40, 96), (40,), ((0,), (0,)), ((), ())),
    "batched_matrix_vector": ((3, 33, 40), (3, 33), ((1,), (1,)), ((0,), (0,))),
}


def _product(case, target, dtype=jnp.bfloat16):
    forms = {**LEFT_ROW_CONTRACTIONS, **LEFT_ROW_CONTRACTIONS_WITH_A_VECTOR}
    a_shape, b_shape, contracting, batch = forms[case]
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)

    def f(x, y):
        with lowering_for(target):
            return linalg.dot(x, y, contracting, batch)

    args = (jnp.asarray(a).astype(dtype), jnp.asarray(b).astype(dtype))
    return f, args


def _copies(f, args) -> int:
    """The layout copies in the traced ``f``."""
    return sum(e.primitive.name == "ffi_call" for e in jax.make_jaxpr(f)(*args).jaxpr.eqns)


def _assert_rounded_once(f, args, contracting, batch):
    """``f(*args)`` is the product rounded once to bfloat16 from a float32 sum: within one
    bf16 step of the exact product."""
    ours = np.asarray(jax.jit(f)(*args), dtype=np.float64)
    a, b = (np.asarray(x, dtype=np.float64) for x in args)
    exact = np.asarray(
        jax.lax.dot_general(
            jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32), (contracting, batch)
        )
    )
    step = float(jnp.finfo(jnp.bfloat16).eps) * np.maximum(np.abs(exact), 1e-3)
    assert ours.shape == exact.shape
    assert (np.abs(ours - exact) <= step).all()


@pytest.mark.parametrize("case", sorted(LEFT_ROW_CONTRACTIONS))
def test_left_row_contractions_through_the_copy(case):
    f, args = _product(case, COPIES)
    _assert_rounded_once(f, args, *LEFT_ROW_CONTRACTIONS[case][2:])
    assert _copies(f, args) == 1
    _assert_no_widened_dot(jax.jit(f).lower(*args).compile().as_text())
    # Without the target, the same product is XLA's widened dot, and no copy.
    g, _ = _product(case, CPU)
    assert _copies(g, args) == 0
    assert layout_copy.widened_dots(jax.jit(g).lower(*args).compile().as_text()) == 1


@pytest.mark.parametrize("case", sorted(LEFT_ROW_CONTRACTIONS_WITH_A_VECTOR))
def test_products_with_a_vector_take_no_copy(case):
    """The vector shorter than the matrix's rows was once taken for the operand to copy,
    and the lowering failed (an IndexError from a 1-d transpose)."""
    f, args = _product(case, COPIES)
    _assert_rounded_once(f, args, *LEFT_ROW_CONTRACTIONS_WITH_A_VECTOR[case][2:])
    assert _copies(f, args) == 0


def test_float32_and_float16_products_take_no_copy():
    for dtype in (jnp.float32, jnp.float16):
        f, args = _product("weight_gradient_copy_lhs", COPIES, dtype)
        assert _copies(f, args) == 0


# ------------------------------------------------------------------ the attention's backward
def _attention_case(dtype=torch.bfloat16, heads=4, causal=True):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, heads, 48, 32).to(dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(2, heads, 48, 32).to(dtype)
    return q, k, v, grad, causal


def _ours(q, k, v, grad, causal, target):
    arrays = [dtypes.tensor_to_array(t.detach()) for t in (q, k, v, grad)]

    def f(q_, k_, v_, g_):
        with lowering_for(target):
            out = attention.forward(q_, k_, v_, None, causal, None)
            return (out, *attention.backward(g_, q_, k_, v_, out, None, causal, None))

    jitted = jax.jit(f)
    results = [np.asarray(r, dtype=np.float64) for r in jitted(*arrays)]
    return results, jitted.lower(*arrays).compile().as_text()


def _float64_reference(q, k, v, grad, causal):
    q, k, v, grad = (t.detach().double().requires_grad_() for t in (q, k, v, grad))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(grad.detach())
    return [t.detach().numpy() for t in (out, q.grad, k.grad, v.grad)]


@pytest.mark.parametrize("target", [CPU, COPIES], ids=["xla", "layout_copies"])
def test_bf16_attention_backward_against_float64_and_eager(target):
    case = _attention_case()
    ours, _ = _ours(*case, target)
    exact = _float64_reference(*case)
    q, k, v, grad, causal = case
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(grad)
    eager = [t.detach().double().numpy() for t in (out, q.grad, k.grad, v.grad)]
    for name, o, x, e in zip(("out", "dq", "dk", "dv"), ours, exact, eager):
        scale = np.abs(x).max()
        # bf16 inputs and results: a few bf16 steps of the largest value at most, and no
        # further from the exact gradient on average than eager torch's own kernel.
        assert np.abs(o - x).max() <= 4 * 2**-8 * scale, name
        assert np.abs(o - x).mean() <= 1.25 * np.abs(e - x).mean() + 1e-6, name


def test_bf16_attention_backward_leaves_no_widened_dot_with_the_copy():
    case = _attention_case()
    _, with_copies = _ours(*case, COPIES)
    _, without = _ours(*case, CPU)
    _assert_no_widened_dot(with_copies)
    assert (
        layout_copy.widened_dots(without) >= 2
    )  # pᵀ·dO and dsᵀ·q (and every other one on jaxlib 0.7)


def test_float32_attention_on_the_cpu_is_written_out_as_jaxs_vjp():
    """Float32 attention on the CPU takes the written-out backward too (JAX's formula without
    its linearization): JAX's own VJP's numbers to float32 rounding, and close to float64.
    On a GPU, and with fewer key/value heads than query heads, JAX's VJP stays."""
    case = _attention_case(torch.float32)
    ours, text = _ours(*case, COPIES)
    exact = _float64_reference(*case)
    for o, x in zip(ours, exact):
        np.testing.assert_allclose(o, x, rtol=0, atol=2e-5 * np.abs(x).max())
    q, k, v, grad = (jnp.asarray(t.detach().numpy()) for t in case[:4])
    with lowering_for(CPU):
        out, vjp = jax.vjp(
            lambda a, b, c: attention.xla_attention(a, b, c, None, case[4], None), q, k, v
        )
        jaxs = [out, *vjp(grad)]
        assert attention._written_out(q, k, v)
    for o, j in zip(ours, jaxs):
        np.testing.assert_allclose(o, j, rtol=0, atol=2e-6 * np.abs(o).max())
    assert "cstorch_swap_last_two" not in text
    with lowering_for(Target("gpu")):
        assert not attention._written_out(q, k, v)
    for dtype in (jnp.bfloat16, jnp.float32):
        q = jnp.zeros((2, 4, 8, 16), dtype)
        kv = jnp.zeros((2, 2, 8, 16), dtype)
        with lowering_for(COPIES):
            assert attention._written_out(q, q, q)
            assert not attention._written_out(q, kv, kv)


def _float32_dots(compiled_text: str) -> int:
    """The dots of a compiled program whose operands are float32 (in a bfloat16 program:
    those XLA widened, inside its library fusions or not)."""
    types = dict(re.findall(r"(%[\w.\-]+) = (\w+)\[", compiled_text))
    count = 0
    for operands in re.findall(r" dot\((%[\w.\-]+), (%[\w.\-]+)\)", compiled_text):
        count += all(types.get(name) == "f32" for name in operands)
    return count


def test_bf16_attention_of_heads_split_by_a_transpose_runs_in_bf16():
    """Query, key and value split into heads by a transpose, as every transformer does: XLA
    widened the forward's two products and two of the backward's to float32; each operand
    made row-major first (``layout_copy.row_major``), all six run in bfloat16, with the
    numbers of the row-major case."""
    torch.manual_seed(0)
    q, k, v, grad = (torch.randn(2, 48, 4, 32).to(torch.bfloat16) for _ in range(4))
    arrays = [dtypes.tensor_to_array(t) for t in (q, k, v, grad)]

    def f(q_, k_, v_, g_):
        q_, k_, v_, g_ = (jnp.swapaxes(t, 1, 2) for t in (q_, k_, v_, g_))
        out = attention.forward(q_, k_, v_, None, True, None)
        return (out, *attention.backward(g_, q_, k_, v_, out, None, True, None))

    def compiled(target):
        def program(*args):
            with lowering_for(target):
                return f(*args)

        return jax.jit(program).lower(*arrays).compile().as_text()

    with_copies, without = compiled(COPIES), compiled(CPU)
    assert with_copies.count("cstorch_row_major_copy") == 4  # q, k, v, the output gradient
    assert "cstorch_row_major_copy" not in without
    assert _float32_dots(without) >= 4
    if layout_copy.xla_keeps_bf16_dots():
        assert _float32_dots(with_copies) == 0
    split = jax.jit(lambda *args: [jnp.asarray(r, jnp.float64) for r in f(*args)])
    with lowering_for(COPIES):
        ours = [np.asarray(r) for r in split(*arrays)]
    exact = _float64_reference(
        *(t.transpose(1, 2).requires_grad_() for t in (q, k, v)), grad.transpose(1, 2), True
    )
    for name, o, x in zip(("out", "dq", "dk", "dv"), ours, exact):
        assert np.abs(o - x).max() <= 4 * 2**-8 * np.abs(x).max(), name


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32, jnp.int32])
def test_row_major_copy_is_the_array(dtype):
    x = jnp.asarray(np.arange(2 * 5 * 3 * 7).reshape(2, 5, 3, 7) % 251).astype(dtype)
    out = jax.jit(lambda t: layout_copy.row_major(jnp.swapaxes(t, 1, 2)))(x)
    assert out.dtype == x.dtype
    assert np.array_equal(np.asarray(out), np.swapaxes(np.asarray(x), 1, 2))


# ------------------------------------------------------------------ where it is used
def test_wanted_only_for_the_engines_cpu_program(monkeypatch):
    from jax_backend import config

    assert config.cpu_half_dots.default == "native"
    monkeypatch.delenv("CSTORCH_CPU_HALF_DOTS", raising=False)
    keeps = layout_copy.xla_keeps_bf16_dots()  # (jaxlib 0.10 and later; not 0.7)
    assert layout_copy.wanted("cpu", None) == keeps
    assert ("half_dot" in torch_kernels.wanted("cpu", None)) == (not keeps)
    assert not layout_copy.wanted("cuda", None)
    assert not layout_copy.wanted("cpu", object())  # a mesh of devices
    for other in ("torch", "xla"):
        monkeypatch.setenv("CSTORCH_CPU_HALF_DOTS", other)
        assert not layout_copy.wanted("cpu", None)
    assert not Target().layout_copies  # exports, pure_function, direct lowerings


def test_without_the_library_native_falls_back_to_torchs_kernel(monkeypatch):
    monkeypatch.delenv("CSTORCH_CPU_HALF_DOTS", raising=False)
    missing = dataclasses.replace(layout_copy.LIBRARY, name="not_built")
    monkeypatch.setattr(layout_copy, "LIBRARY", missing)
    assert not layout_copy.wanted("cpu", None)
    assert "half_dot" in torch_kernels.wanted("cpu", None)
    with pytest.raises(RuntimeError, match="not built"):
        layout_copy.swap_last_two(jnp.ones((2, 2), jnp.bfloat16))
