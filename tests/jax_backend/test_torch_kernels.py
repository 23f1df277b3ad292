"""A CPU step's convolutions by torch's own kernels (``jax_backend/ops/torch_kernels.py``):
with ``Target.torch_kernels`` the convolution lowering and both gradients are torch's CPU
kernels called on the host, so float32 results equal eager torch's bit for bit; half operands
are widened to float32 and the result rounded once (what the XLA lowering computes on a CPU);
every other target, and float64, keep XLA's convolutions."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jax_backend.ops import torch_kernels
from jax_backend.ops.nn import aten_convolution, aten_convolution_backward
from jax_backend.target import Target, lowering_for

aten = torch.ops.aten

# (input shape, weight shape, stride, padding, dilation, transposed, output_padding, groups)
VARIANTS = {
    "conv2d_mnist": ((4, 3, 12, 12), (8, 3, 3, 3), [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
    "conv2d_stride_padding": (
        (3, 4, 11, 10),
        (6, 4, 3, 3),
        [2, 2],
        [1, 1],
        [1, 1],
        False,
        [0, 0],
        1,
    ),
    "conv2d_groups_dilation": (
        (2, 8, 11, 10),
        (12, 4, 3, 3),
        [1, 1],
        [2, 2],
        [2, 2],
        False,
        [0, 0],
        2,
    ),
    "conv1d_depthwise": ((4, 8, 20), (16, 1, 3), [1], [1], [1], False, [0], 8),
    "conv3d": (
        (2, 4, 6, 7, 6),
        (6, 4, 3, 3, 3),
        [1, 2, 1],
        [1, 1, 1],
        [1, 1, 1],
        False,
        [0, 0, 0],
        1,
    ),
    "conv_transpose2d": ((4, 8, 6, 7), (8, 6, 3, 3), [2, 2], [1, 1], [1, 1], True, [1, 1], 2),
}
TORCH_KERNELS = Target("cpu", torch_kernels=frozenset({"convolution"}))
# The same kernels through the engine's FFI library (cpu_convolutions="native", the default).
NATIVE = Target(
    "cpu", torch_kernels=frozenset({"convolution"}), native_kernels=frozenset({"convolution"})
)
ROUTES = {"callback": TORCH_KERNELS, "native": NATIVE}
MASKS = ([True, True, True], [False, True, True], [True, False, False])


def _out_channels(w_shape, transposed, groups):
    return w_shape[1] * groups if transposed else w_shape[0]


def _operands(variant, dtype=torch.float32):
    x_shape, w_shape, *args = VARIANTS[variant]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*x_shape, generator=g).to(dtype)
    w = torch.randn(*w_shape, generator=g).to(dtype)
    bias = torch.randn(_out_channels(w_shape, args[3], args[5]), generator=g).to(dtype)
    grad = torch.randn(
        *aten.convolution(x.float(), w.float(), bias.float(), *args).shape, generator=g
    ).to(dtype)
    return x, w, bias, grad, args


def _jax(t):
    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)
    return jnp.asarray(t.numpy())


def _torch(a):
    return torch.from_numpy(np.array(a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a))


def _lowered(target, x, w, bias, grad, args, mask):
    out_channels = bias.shape[0]
    with lowering_for(target):
        ours = jax.jit(lambda x, w, b: aten_convolution(x, w, b, *args))(
            _jax(x), _jax(w), _jax(bias)
        )
        grads = jax.jit(
            lambda g, x, w: aten_convolution_backward(g, x, w, [out_channels], *args, mask)
        )(_jax(grad), _jax(x), _jax(w))
    return ours, grads


@pytest.mark.parametrize(
    "route, variant, mask", list(itertools.product(ROUTES, sorted(VARIANTS), MASKS))
)
def test_float32_convolution_and_its_gradients_are_torchs_bit_for_bit(route, variant, mask):
    x, w, bias, grad, args = _operands(variant)
    expected = aten.convolution(x, w, bias, *args)
    expected_grads = aten.convolution_backward(grad, x, w, [bias.shape[0]], *args, mask)
    ours, grads = _lowered(ROUTES[route], x, w, bias, grad, args, mask)
    assert ours.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(ours), expected.numpy())
    for name, mine, theirs, wanted in zip(("input", "weight", "bias"), grads, expected_grads, mask):
        assert (mine is not None) == wanted, name
        if wanted:
            assert mine.dtype == jnp.float32, name
            np.testing.assert_array_equal(np.asarray(mine), theirs.numpy(), err_msg=name)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_xla_convolutions_agree_with_torchs_kernels(variant):
    """XLA and torch compute the same convolutions (to float32 rounding of the sums)."""
    x, w, bias, grad, args = _operands(variant)
    ours, grads = _lowered(NATIVE, x, w, bias, grad, args, [True] * 3)
    xla, xla_grads = _lowered(Target("cpu"), x, w, bias, grad, args, [True] * 3)
    for mine, theirs in zip((ours, *grads), (xla, *xla_grads)):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "route, variant", list(itertools.product(ROUTES, ["conv2d_stride_padding", "conv_transpose2d"]))
)
def test_bf16_operands_run_torchs_bf16_kernels(route, variant):
    """bf16 operands (autocast's): torch's bf16 kernel, forward and gradients, bit for bit
    what eager autocast computes."""
    x, w, bias, grad, args = _operands(variant, torch.bfloat16)
    expected = aten.convolution(x, w, bias, *args)
    expected_grads = aten.convolution_backward(grad, x, w, [bias.shape[0]], *args, [True] * 3)
    ours, grads = _lowered(ROUTES[route], x, w, bias, grad, args, [True] * 3)
    assert ours.dtype == jnp.bfloat16
    assert torch.equal(_torch(ours).bfloat16(), expected)
    for mine, theirs in zip(grads, expected_grads):
        assert mine.dtype == jnp.bfloat16
        assert torch.equal(_torch(mine).bfloat16(), theirs)


@pytest.mark.parametrize(
    "route, variant", list(itertools.product(ROUTES, ["conv2d_stride_padding", "conv_transpose2d"]))
)
def test_fp16_operands_are_widened_and_rounded_once(route, variant):
    """fp16 operands: torch's float32 kernel on the exactly widened values, the result
    rounded once to fp16, forward and gradients."""
    x, w, bias, grad, args = _operands(variant, torch.float16)
    wide = [t.float() for t in (x, w, bias, grad)]
    expected = aten.convolution(*wide[:3], *args).half()
    expected_grads = [
        g.half()
        for g in aten.convolution_backward(wide[3], *wide[:2], [bias.shape[0]], *args, [True] * 3)
    ]
    ours, grads = _lowered(ROUTES[route], x, w, bias, grad, args, [True] * 3)
    assert ours.dtype == jnp.float16
    assert torch.equal(_torch(ours).half(), expected)
    for mine, theirs in zip(grads, expected_grads):
        assert mine.dtype == jnp.float16
        assert torch.equal(_torch(mine).half(), theirs)


@pytest.mark.parametrize("route", ROUTES)
def test_unbatched_input(route):
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g) for s in ((3, 9, 9), (5, 3, 3, 3), (5,)))
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    with lowering_for(ROUTES[route]):
        ours = jax.jit(lambda x, w, b: aten_convolution(x, w, b, *args))(_jax(x), _jax(w), _jax(b))
    np.testing.assert_array_equal(np.asarray(ours), aten.convolution(x[None], w, b, *args)[0])


def _primitives(target, dtype):
    x, w, g = (jnp.ones(s, dtype) for s in ((2, 4, 8, 8), (6, 4, 3, 3), (2, 6, 8, 8)))
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    with lowering_for(target):
        forward = jax.make_jaxpr(lambda x, w: aten_convolution(x, w, None, *args))(x, w)
        backward = jax.make_jaxpr(
            lambda g, x, w: aten_convolution_backward(g, x, w, [6], *args, [True, True, True])
        )(g, x, w)
    return {e.primitive.name for jaxpr in (forward, backward) for e in jaxpr.eqns}


@pytest.mark.parametrize(
    "target, dtype",
    [
        (Target("cpu"), jnp.float32),
        (Target("cuda"), jnp.float32),
        (Target("any"), jnp.float32),
        (TORCH_KERNELS, jnp.float64),
    ],
)
def test_every_other_target_keeps_xlas_convolutions(target, dtype):
    """Without ``torch_kernels`` (a GPU, an export, ``pure_function``, the default target),
    and for float64 operands, the lowering is XLA's."""
    primitives = _primitives(target, dtype)
    assert "conv_general_dilated" in primitives
    assert not primitives & {"pure_callback", "ffi_call"}


@pytest.mark.parametrize("route, call", [("callback", "pure_callback"), ("native", "ffi_call")])
def test_torch_kernels_replace_every_convolution(route, call):
    primitives = _primitives(ROUTES[route], jnp.float32)
    assert call in primitives
    assert not primitives & {"conv_general_dilated", "pure_callback", "ffi_call"} - {call}


def test_wanted_only_for_one_cpu_device_and_the_setting(monkeypatch):
    from jax_backend import config

    assert config.cpu_convolutions.default == "native"
    assert config.cpu_half_dots.default == "native"  # (test_layout_copy.py)
    monkeypatch.delenv("CSTORCH_CPU_CONVOLUTIONS", raising=False)
    assert "convolution" in torch_kernels.wanted("cpu", None)
    monkeypatch.setenv("CSTORCH_CPU_CONVOLUTIONS", "torch")
    monkeypatch.setenv("CSTORCH_CPU_HALF_DOTS", "torch")
    assert torch_kernels.wanted("cpu", None) == {"convolution", "half_dot"}
    assert torch_kernels.wanted("cuda", None) == frozenset()
    assert torch_kernels.wanted("cpu", object()) == frozenset()  # a mesh of devices
    monkeypatch.setenv("CSTORCH_CPU_CONVOLUTIONS", "xla")
    assert torch_kernels.wanted("cpu", None) == {"half_dot"}
    monkeypatch.setenv("CSTORCH_CPU_HALF_DOTS", "xla")
    assert torch_kernels.wanted("cpu", None) == frozenset()


def test_native_convolutions_where_the_library_is_built(monkeypatch):
    """``native`` calls torch's kernels through the engine's FFI library, built by `make
    native` for the running jaxlib and torch (no skip: a broken build fails here); ``torch``
    through host callbacks; without the library ``native`` runs as ``torch``."""
    assert torch_kernels.LIBRARY.unavailable() is None
    kinds = frozenset({"convolution"})
    monkeypatch.setenv("CSTORCH_CPU_CONVOLUTIONS", "native")
    assert torch_kernels.called_natively(kinds) == kinds
    assert torch_kernels.called_natively(frozenset()) == frozenset()
    monkeypatch.setenv("CSTORCH_CPU_CONVOLUTIONS", "torch")
    assert torch_kernels.called_natively(kinds) == frozenset()

    monkeypatch.setenv("CSTORCH_CPU_CONVOLUTIONS", "native")
    missing = dataclasses.replace(torch_kernels.LIBRARY, name="not_built")
    monkeypatch.setattr(torch_kernels, "LIBRARY", missing)
    assert "convolution" in torch_kernels.wanted("cpu", None)
    assert torch_kernels.called_natively(kinds) == frozenset()
    with pytest.raises(RuntimeError, match="not built"):  # a target that asks anyway
        _primitives(NATIVE, jnp.float32)


def test_an_error_in_torchs_kernel_is_a_python_exception_with_torchs_message():
    """The custom call returns torch's error to XLA, which raises it in Python: torch's own
    message, without its C++ backtrace; and a buffer of a dtype the library does not take
    (the lowering never passes one) is refused the same way."""
    assert torch_kernels.LIBRARY.unavailable() is None
    x, w = jnp.ones((2, 4, 8, 8), jnp.float32), jnp.ones((6, 4, 3, 3), jnp.float32)
    attributes = torch_kernels._attributes([1, 1], [0, 0], [1, 1], False, [0, 0], 1)

    def call(shape, *operands, **changed):
        result = jax.ShapeDtypeStruct(shape, operands[0].dtype)
        run = jax.ffi.ffi_call(torch_kernels._CONVOLUTION, result)
        return np.asarray(run(*operands, **{**attributes, **changed}))

    with pytest.raises(Exception, match="torch's convolution: .*groups") as error:
        call((2, 6, 6, 6), x, w, groups=np.int64(3))  # 4 input channels in 3 groups
    assert "frame #" not in str(error.value)
    with pytest.raises(Exception, match="not resizable"):  # a result of the wrong shape
        call((2, 6, 5, 5), x, w)
    with pytest.raises(Exception, match="only float32 and bfloat16"):
        call((2, 6, 6, 6), x.astype(jnp.float16), w.astype(jnp.float16))
    np.testing.assert_array_equal(call((2, 6, 6, 6), x, w), np.full((2, 6, 6, 6), 36.0))
