"""Table-driven tests of tricky lowerings against eager torch.

Each record is one step function with its inputs: it is captured (make_fx + core-ATen
decompositions + functionalization), run by ``GraphInterpreter(strict=True)`` under
``jax.jit`` (so a lowering whose dtype differs from torch's fails instead of being cast), and
compared with eager torch: values within the record's tolerance and dtypes exactly. Records
with ``grad=True`` also compare the gradients of the outputs (random cotangents) with respect
to every floating-point input that requires grad.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from jax_backend import GraphInterpreter, Program, Slot, capture_step, dtypes
from jax_backend.registry import has_lowering
from tests.lanes import marked_cases

aten = torch.ops.aten


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable
    make: Callable  # () -> list of input tensors
    grad: bool = False
    rtol: float = 1e-5
    atol: float = 1e-6


def _float(*shape, low=-3.0, high=3.0, grad=False, dtype=torch.float32):
    def make():
        t = torch.empty(shape, dtype=dtype).uniform_(low, high)
        return t.requires_grad_(grad)

    return make


def _ints(*shape, low=-10, high=10, dtype=torch.int64):
    return lambda: torch.randint(low, high, shape, dtype=dtype)


def _inputs(*makers):
    return lambda: [m() if callable(m) else m for m in makers]


def _nonzero_ints(*shape, dtype=torch.int64):
    def make():
        t = torch.randint(1, 8, shape, dtype=dtype)
        return t * (torch.randint(0, 2, shape, dtype=dtype) * 2 - 1)

    return make


def run_engine(fn, inputs, extra=()):
    captured = capture_step(fn, [], list(inputs) + list(extra))
    interpreter = GraphInterpreter(captured.graph, strict=True)
    jitted = jax.jit(lambda args, key: interpreter.run(args, key))
    arrays = [dtypes.tensor_to_array(x.detach()) for x in list(inputs) + list(extra)]
    return [dtypes.array_to_tensor(np.asarray(o)) for o in jitted(arrays, jax.random.key(0))]


def assert_same(actual, expected, rtol, atol, what):
    expected = expected.detach()
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != torch {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if not (expected.is_floating_point() or expected.is_complex()):
        rtol = atol = 0.0
    torch.testing.assert_close(
        actual, expected, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}"
    )


def _leaves(out):
    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


def check(case: Case):
    torch.manual_seed(0)
    inputs = case.make()
    outs = _leaves(case.fn(*inputs))
    if not case.grad:
        got = run_engine(lambda *xs: _leaves(case.fn(*xs)), inputs)
        for k, (a, e) in enumerate(zip(got, outs)):
            assert_same(a, e, case.rtol, case.atol, f"{case.name} output {k}")
        return
    diff_in = [i for i, x in enumerate(inputs) if x.requires_grad]
    diff_out = [k for k, o in enumerate(outs) if o.requires_grad]
    gouts = [torch.randn_like(outs[k]) for k in diff_out]
    grads = torch.autograd.grad([outs[k] for k in diff_out], [inputs[i] for i in diff_in], gouts)
    n = len(inputs)

    def step(*xs):
        ins = list(xs[:n])
        res = _leaves(case.fn(*ins))
        g = torch.autograd.grad([res[k] for k in diff_out], [ins[i] for i in diff_in], list(xs[n:]))
        return res, list(g)

    got = run_engine(step, [x.detach().requires_grad_(x.requires_grad) for x in inputs], gouts)
    for k, (a, e) in enumerate(zip(got[: len(outs)], outs)):
        assert_same(a, e, case.rtol, case.atol, f"{case.name} output {k}")
    for j, (a, e) in enumerate(zip(got[len(outs) :], grads)):
        assert_same(a, e, case.rtol, case.atol, f"{case.name} grad {j}")


_scalar_f64 = lambda: torch.tensor(2.5, dtype=torch.float64)  # noqa: E731
_scalar_i64 = lambda: torch.tensor(3)  # noqa: E731

CASES = [
    # --------------------------------------------------------------- type promotion
    Case(
        "int32_plus_0dim_float64",
        lambda a, b: a + b,
        _inputs(_ints(4, dtype=torch.int32), _scalar_f64),
    ),
    Case(
        "float16_plus_0dim_float32",
        lambda a, b: a + b,
        _inputs(_float(4, dtype=torch.float16), lambda: torch.tensor(1.5)),
    ),
    Case("int8_plus_python_int", lambda a: a + 3, _inputs(_ints(5, dtype=torch.int8))),
    Case("int64_times_python_float", lambda a: a * 2.5, _inputs(_ints(5))),
    Case(
        "uint8_plus_int8",
        lambda a, b: a + b,
        _inputs(_ints(5, low=0, high=20, dtype=torch.uint8), _ints(5, dtype=torch.int8)),
    ),
    Case(
        "bool_plus_bool",
        lambda a, b: a + b,
        _inputs(lambda: torch.rand(6) > 0.5, lambda: torch.rand(6) > 0.5),
    ),
    Case("bool_times_float_scalar", lambda a: a * 1.5, _inputs(lambda: torch.rand(6) > 0.5)),
    Case("int_true_divide", lambda a, b: a / b, _inputs(_ints(6), _nonzero_ints(6))),
    Case(
        "0dim_int_times_float_tensor",
        lambda a, b: a * b,
        _inputs(_scalar_i64, _float(3, dtype=torch.float64)),
    ),
    Case("float32_tensor_plus_0dim_float64", lambda a, b: a + b, _inputs(_float(3), _scalar_f64)),
    Case(
        "where_scalar_int_and_float_tensor",
        lambda c, x: torch.where(c, 2, x),
        _inputs(lambda: torch.rand(5) > 0.5, _float(5, dtype=torch.float16)),
    ),
    Case("comparison_int_vs_float_scalar", lambda a: a > 2.5, _inputs(_ints(7))),
    Case("sum_of_bool_is_int64", lambda a: a.sum(), _inputs(lambda: torch.rand(9) > 0.5)),
    Case(
        "cumsum_int32_is_int64", lambda a: torch.cumsum(a, 0), _inputs(_ints(9, dtype=torch.int32))
    ),
    Case("mean_with_dtype", lambda a: a.mean(dtype=torch.float64), _inputs(_float(4, 5))),
    Case("pow_int_tensor_float_scalar", lambda a: a**0.5, _inputs(_ints(5, low=0, high=9))),
    Case("pow_scalar_base", lambda a: 2**a, _inputs(_float(5))),
    Case("pow_int_int", lambda a: a**3, _inputs(_ints(5))),
    # --------------------------------------------------------------- integer division
    Case(
        "div_trunc_int",
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        _inputs(_ints(16, low=-20, high=20), _nonzero_ints(16)),
    ),
    Case(
        "div_floor_int",
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        _inputs(_ints(16, low=-20, high=20), _nonzero_ints(16)),
    ),
    Case(
        "div_floor_float",
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        _inputs(_float(16, low=-20, high=20), _float(16, low=0.5, high=3)),
    ),
    Case(
        "div_trunc_float_negative",
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        _inputs(_float(16, low=-20, high=20), _float(16, low=-3, high=-0.5)),
    ),
    Case("floor_divide_int_scalar", lambda a: a // -3, _inputs(_ints(16, low=-20, high=20))),
    Case(
        "remainder_int_negative",
        lambda a, b: torch.remainder(a, b),
        _inputs(_ints(16, low=-20, high=20), _nonzero_ints(16)),
    ),
    Case(
        "fmod_int_negative",
        lambda a, b: torch.fmod(a, b),
        _inputs(_ints(16, low=-20, high=20), _nonzero_ints(16)),
    ),
    Case(
        "remainder_float", lambda a: torch.remainder(a, -1.5), _inputs(_float(16, low=-5, high=5))
    ),
    # --------------------------------------------------------------- pooling
    Case(
        "max_pool2d_ceil_pad_dilation",
        lambda x: F.max_pool2d(x, 3, stride=2, padding=1, dilation=2, ceil_mode=True),
        _inputs(_float(2, 3, 11, 10, grad=True)),
        grad=True,
    ),
    Case(
        "max_pool2d_indices",
        lambda x: F.max_pool2d(x, 2, stride=2, ceil_mode=True, return_indices=True),
        _inputs(_float(1, 2, 7, 7, grad=True)),
        grad=True,
    ),
    Case(
        "max_pool1d",
        lambda x: F.max_pool1d(x, 3, stride=2, padding=1),
        _inputs(_float(2, 3, 9, grad=True)),
        grad=True,
    ),
    Case(
        "max_pool3d_ceil",
        lambda x: F.max_pool3d(x, 2, stride=2, ceil_mode=True),
        _inputs(_float(1, 2, 5, 5, 5, grad=True)),
        grad=True,
    ),
    Case(
        "avg_pool2d_ceil_no_pad_count",
        lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
        _inputs(_float(2, 3, 10, 9, grad=True)),
        grad=True,
    ),
    Case(
        "avg_pool2d_divisor_override",
        lambda x: F.avg_pool2d(x, 2, stride=1, padding=1, divisor_override=3),
        _inputs(_float(1, 2, 5, 5, grad=True)),
        grad=True,
    ),
    Case(
        "avg_pool1d_count_include_pad",
        lambda x: F.avg_pool1d(x, 4, stride=3, padding=2, ceil_mode=True),
        _inputs(_float(2, 3, 10, grad=True)),
        grad=True,
    ),
    Case(
        "adaptive_avg_pool2d",
        lambda x: F.adaptive_avg_pool2d(x, (3, 4)),
        _inputs(_float(2, 3, 7, 9, grad=True)),
        grad=True,
    ),
    Case(
        "adaptive_max_pool2d",
        lambda x: F.adaptive_max_pool2d(x, (3, 2)),
        _inputs(_float(2, 3, 7, 5, grad=True)),
        grad=True,
    ),
    # --------------------------------------------------------------- convolution
    Case(
        "conv2d_groups_dilation_stride",
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=2, dilation=2, groups=2),
        _inputs(_float(2, 4, 9, 8, grad=True), _float(6, 2, 3, 3, grad=True), _float(6, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "conv2d_padding_same",
        lambda x, w: F.conv2d(x, w, padding="same"),
        _inputs(_float(1, 3, 6, 7, grad=True), _float(4, 3, 4, 3, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "conv1d_depthwise",
        lambda x, w: F.conv1d(x, w, groups=4, padding=1),
        _inputs(_float(2, 4, 10, grad=True), _float(8, 1, 3, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "conv_transpose2d_output_padding_groups",
        lambda x, w, b: F.conv_transpose2d(
            x, w, b, stride=2, padding=1, output_padding=1, groups=2, dilation=2
        ),
        _inputs(_float(2, 4, 5, 6, grad=True), _float(4, 3, 3, 3, grad=True), _float(6, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "conv_transpose1d",
        lambda x, w: F.conv_transpose1d(x, w, stride=3, padding=2),
        _inputs(_float(2, 3, 7, grad=True), _float(3, 5, 4, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "conv3d",
        lambda x, w: F.conv3d(x, w, stride=(1, 2, 1), padding=1),
        _inputs(_float(1, 2, 5, 6, 5, grad=True), _float(3, 2, 3, 3, 3, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "conv2d_unbatched",
        lambda x, w: F.conv2d(x, w),
        _inputs(_float(3, 6, 6, grad=True), _float(2, 3, 3, 3, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    # --------------------------------------------------------------- normalisation
    Case(
        "batch_norm_train_no_stats",
        lambda x, w, b: F.batch_norm(x, None, None, w, b, True),
        _inputs(_float(4, 3, 5, grad=True), _float(3, grad=True), _float(3, grad=True)),
        grad=True,
    ),
    Case(
        "batch_norm_eval",
        lambda x, m, v, w: F.batch_norm(x, m, v, w, None, False),
        _inputs(
            _float(4, 3, 5, grad=True), _float(3), _float(3, low=0.5, high=2), _float(3, grad=True)
        ),
        grad=True,
    ),
    Case(
        "layer_norm",
        lambda x, w, b: F.layer_norm(x, (4, 5), w, b),
        _inputs(_float(3, 4, 5, grad=True), _float(4, 5, grad=True), _float(4, 5, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "group_norm",
        lambda x, w, b: F.group_norm(x, 2, w, b),
        _inputs(_float(3, 4, 5, grad=True), _float(4, grad=True), _float(4, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "softmax_log_softmax",
        lambda x: (F.softmax(x, -1), F.log_softmax(x, 0)),
        _inputs(_float(4, 7, grad=True)),
        grad=True,
    ),
    Case(
        "softmax_dtype_arg", lambda x: F.softmax(x, 1, dtype=torch.float64), _inputs(_float(3, 5))
    ),
    # --------------------------------------------------------------- scatter / gather
    Case(
        "gather",
        lambda x, i: torch.gather(x, 1, i),
        _inputs(_float(4, 5, grad=True), lambda: torch.randint(0, 5, (4, 3))),
        grad=True,
    ),
    Case(
        "scatter_add_duplicates",
        lambda x, i, s: torch.scatter_add(x, 0, i, s),
        _inputs(
            _float(3, 4, grad=True),
            lambda: torch.tensor([[0, 1, 0, 2], [0, 0, 0, 0]]),
            _float(2, 4, grad=True),
        ),
        grad=True,
    ),
    # one position per row along dim (the cross-entropy gradient's one-hot): a compare-select
    Case(
        "scatter_value_one_per_row",
        lambda x, i: torch.scatter(x, 1, i, -1.5),
        _inputs(_float(4, 6), lambda: torch.tensor([[2], [0], [5], [2]])),
    ),
    Case(
        "scatter_src_one_per_row_dim0",
        lambda x, i, s: torch.scatter(x, 0, i, s),
        _inputs(
            _float(5, 3, grad=True), lambda: torch.tensor([[4, 0, 1]]), _float(1, 3, grad=True)
        ),
        grad=True,
    ),
    Case(
        "scatter_src_one_per_row_wider_src",
        lambda x, i, s: torch.scatter(x, 1, i, s),
        _inputs(_float(3, 4), lambda: torch.tensor([[3], [1], [0]]), _float(3, 2)),
    ),
    Case(
        "scatter_add_one_per_row_3d",
        lambda x, i, s: torch.scatter_add(x, 2, i, s),
        _inputs(
            _float(2, 3, 4, grad=True),
            lambda: torch.randint(0, 4, (2, 3, 1)),
            _float(2, 3, 1, grad=True),
        ),
        grad=True,
    ),
    Case(
        "cross_entropy_grad",
        lambda x, t: F.cross_entropy(x, t),
        _inputs(_float(6, 9, grad=True), lambda: torch.tensor([0, 8, 3, 3, 1, 7])),
        grad=True,
    ),
    Case(
        "scatter_reduce_amax_exclude_self",
        lambda x, i, s: torch.scatter_reduce(x, 0, i, s, "amax", include_self=False),
        _inputs(_float(4), lambda: torch.tensor([0, 2, 0, 2, 1]), _float(5)),
    ),
    Case(
        "scatter_reduce_mean",
        lambda x, i, s: torch.scatter_reduce(x, 0, i, s, "mean"),
        _inputs(_float(4), lambda: torch.tensor([0, 2, 0, 2, 1]), _float(5)),
    ),
    Case(
        "index_put_accumulate_duplicates",
        lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True),
        _inputs(
            _float(5, 3, grad=True), lambda: torch.tensor([0, 4, 0, 0]), _float(4, 3, grad=True)
        ),
        grad=True,
    ),
    Case(
        "index_put_no_accumulate",
        lambda x, i, v: torch.index_put(x, (i,), v),
        _inputs(_float(5, 3), lambda: torch.tensor([1, 4, 2]), _float(3, 3)),
    ),
    Case(
        "index_add_alpha",
        lambda x, i, s: torch.index_add(x, 1, i, s, alpha=2.0),
        _inputs(_float(3, 5, grad=True), lambda: torch.tensor([4, 0, 4]), _float(3, 3, grad=True)),
        grad=True,
    ),
    Case(
        "advanced_index_negative",
        lambda x, i: x[:, i],
        _inputs(_float(3, 6, grad=True), lambda: torch.tensor([-1, 0, -1, 2])),
        grad=True,
    ),
    Case(
        "embedding_padding_idx",
        lambda w, i: F.embedding(i, w, padding_idx=1),
        _inputs(_float(6, 3, grad=True), lambda: torch.tensor([[1, 2, 1], [5, 0, 1]])),
        grad=True,
    ),
    Case(
        "masked_fill_where",
        lambda x, m: x.masked_fill(m, -1.0),
        _inputs(_float(4, 4, grad=True), lambda: torch.rand(4, 4) > 0.5),
        grad=True,
    ),
    # --------------------------------------------------------------- sorting and extremes
    Case(
        "sort_stable_ties",
        lambda x: torch.sort(x, stable=True),
        _inputs(lambda: torch.tensor([3.0, 1.0, 2.0, 1.0, 3.0, 0.0, 2.0])),
    ),
    Case(
        "sort_descending_stable_ties",
        lambda x: torch.sort(x, descending=True, stable=True),
        _inputs(lambda: torch.tensor([[3.0, 1.0, 3.0, 1.0], [2.0, 2.0, 0.0, 2.0]])),
    ),
    Case(
        "sort_nan_last",
        lambda x: torch.sort(x),
        _inputs(lambda: torch.tensor([1.0, float("nan"), -1.0, 0.0])),
    ),
    Case(
        "argsort_int",
        lambda x: torch.argsort(x, stable=True),
        _inputs(lambda: torch.tensor([2, 2, 1, 1, 0])),
    ),
    Case(
        "topk_values",
        lambda x: torch.topk(x, 3).values,
        _inputs(_float(4, 9, grad=True)),
        grad=True,
    ),
    Case("topk_smallest", lambda x: torch.topk(x, 2, dim=0, largest=False), _inputs(_float(5, 3))),
    Case(
        "argmax_ties_first",
        lambda x: (torch.argmax(x, 1), torch.argmin(x, 1)),
        _inputs(lambda: torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])),
    ),
    Case(
        "max_dim_nan",
        lambda x: torch.max(x, 1),
        _inputs(lambda: torch.tensor([[1.0, float("nan"), 3.0], [2.0, 5.0, 0.0]])),
    ),
    Case(
        "amax_grad_ties",
        lambda x: torch.amax(x, 1),
        _inputs(lambda: torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], requires_grad=True)),
        grad=True,
    ),
    Case("cummax", lambda x: torch.cummax(x, 0), _inputs(_float(7, 2))),
    Case(
        "median_kthvalue",
        lambda x: (torch.median(x, 1), torch.kthvalue(x, 2, 0)),
        _inputs(_float(5, 7)),
    ),
    # --------------------------------------------------------------- misc
    Case(
        "clamp_tensor_bounds",
        lambda x, lo, hi: torch.clamp(x, lo, hi),
        _inputs(_float(6, grad=True), _float(6, low=-2, high=0), _float(6, low=0, high=2)),
        grad=True,
    ),
    Case(
        "gelu_tanh",
        lambda x: F.gelu(x, approximate="tanh"),
        _inputs(_float(10, grad=True)),
        grad=True,
    ),
    Case(
        "interpolate_bilinear_align",
        lambda x: F.interpolate(x, scale_factor=2.5, mode="bilinear", align_corners=True),
        _inputs(_float(1, 2, 4, 5, grad=True)),
        grad=True,
    ),
    Case(
        "interpolate_nearest",
        lambda x: F.interpolate(x, size=(7, 3), mode="nearest"),
        _inputs(_float(1, 2, 4, 5, grad=True)),
        grad=True,
    ),
    Case(
        "sdpa_causal",
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        _inputs(
            _float(2, 3, 5, 8, grad=True),
            _float(2, 3, 5, 8, grad=True),
            _float(2, 3, 5, 8, grad=True),
        ),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "sdpa_bool_mask",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        _inputs(
            _float(2, 4, 8, grad=True),
            _float(2, 6, 8, grad=True),
            _float(2, 6, 8, grad=True),
            lambda: torch.rand(4, 6) > 0.3,
        ),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "cross_entropy_label_smoothing",
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
        _inputs(_float(4, 5, grad=True), lambda: torch.randint(0, 5, (4,))),
        grad=True,
    ),
    # torch.nn.utils.weight_norm (the zoo's dino / generic_image_encoders heads): the
    # forward decomposes; its backward is lowered. dim=0, the last dim and the whole tensor.
    *[
        Case(
            f"weight_norm_interface_dim{dim}",
            lambda v, g, dim=dim: torch._weight_norm_interface(v, g, dim),
            _inputs(
                _float(5, 3, 4, grad=True),
                _float(
                    *[(5, 3, 4)[i] if i == dim % 3 else 1 for i in range(3)],
                    low=0.5,
                    high=2.0,
                    grad=True,
                ),
            ),
            grad=True,
            rtol=1e-5,
            atol=1e-5,
        )
        for dim in (0, 2)
    ],
    Case(
        "weight_norm_whole_tensor",
        lambda v, g: torch._weight_norm(v, g, -1),
        _inputs(_float(6, 4, grad=True), _float(1, 1, low=0.5, high=2.0, grad=True)),
        grad=True,
        atol=1e-5,
    ),
    Case(
        "fft_rfft_irfft",
        lambda x: (torch.fft.rfft(x, norm="ortho"), torch.fft.irfft(torch.fft.rfft(x), n=8)),
        _inputs(_float(3, 8)),
        atol=1e-5,
    ),
]


# Cases of a second or more (convolutions, pooling, norms: long compilations).
SLOW_CASES = {
    "adaptive_max_pool2d",
    "batch_norm_train_no_stats",
    "conv1d_depthwise",
    "conv2d_groups_dilation_stride",
    "conv2d_padding_same",
    "conv2d_unbatched",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d_output_padding_groups",
    "cross_entropy_label_smoothing",
    "group_norm",
    "interpolate_bilinear_align",
    "interpolate_nearest",
    "layer_norm",
    "max_pool1d",
    "max_pool2d_ceil_pad_dilation",
    "max_pool2d_indices",
    "max_pool3d_ceil",
    "median_kthvalue",
    "sdpa_bool_mask",
    "sdpa_causal",
    "softmax_log_softmax",
}


@pytest.mark.parametrize("case", marked_cases(CASES, ids=[c.name for c in CASES], slow=SLOW_CASES))
def test_lowering_matches_eager(case):
    check(case)


# --------------------------------------------------------------- batch norm running stats
@pytest.mark.parametrize(
    "training", marked_cases([True, False], ids=["True", "False"], slow={"True"})
)
def test_batch_norm_running_stats(training):
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm2d(3, momentum=0.2)
    with torch.no_grad():
        eager.running_mean.uniform_(-1, 1)
        eager.running_var.uniform_(0.5, 2)
        eager.weight.uniform_(0.5, 1.5)
    eager.train(training)
    module = torch.nn.BatchNorm2d(3, momentum=0.2)
    module.load_state_dict(eager.state_dict())
    module.train(training)
    x = torch.randn(4, 3, 5, 5) * 2 + 1

    slots = [
        Slot(module._buffers, "running_mean"),
        Slot(module._buffers, "running_var"),
        Slot(module._buffers, "num_batches_tracked"),
        Slot(module._parameters, "weight"),
        Slot(module._parameters, "bias"),
    ]
    captured = capture_step(lambda inp: module(inp), slots, [x])
    program = Program(captured)
    state = [s.get() for s in slots]
    used = [dtypes.tensor_to_array(state[i].detach()) for i in captured.used_state]
    new_state, outputs = program(used, [dtypes.tensor_to_array(x)], 0)
    expected = eager(x)
    np.testing.assert_allclose(
        np.asarray(outputs[0]), expected.detach().numpy(), rtol=1e-5, atol=1e-5
    )
    new_values = dict(zip(captured.written_state, new_state))
    for index, name in [(0, "running_mean"), (1, "running_var"), (2, "num_batches_tracked")]:
        if training:
            got = np.asarray(new_values[index])
            np.testing.assert_allclose(got, getattr(eager, name).numpy(), rtol=1e-5, atol=1e-6)
        else:
            assert index not in new_values  # eval mode writes no running stats


# --------------------------------------------------------------- the pinned core opset
# Core ATen overloads (torch.Tag.core in the pinned torch) deliberately left without a lowering.
UNLOWERED_CORE = {
    "aten._local_scalar_dense.default": "reads a value (.item()); capture rejects it first",
    "aten.nonzero.default": "data-dependent output shape; capture rejects it first",
    "aten.sym_numel.default": "symbolic shapes are not traced (static graphs)",
    "aten.sym_size.int": "symbolic shapes are not traced (static graphs)",
    "aten.sym_storage_offset.default": "symbolic shapes are not traced (static graphs)",
    "aten.sym_stride.int": "symbolic shapes are not traced (static graphs)",
    "aten.atan2.out": "out= overloads never survive functionalization",
    "aten._native_batch_norm_legit.default": "mutates running stats; functionalization "
    "replaces it by the _functional overload",
    "aten.col2im.default": "decomposed by core_aten_decompositions",
    "aten.sym_is_contiguous.default": "symbolic shapes are not traced (static graphs)",
}


def _core_overloads():
    ops = []
    for name in dir(aten):
        packet = getattr(aten, name)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags:
                ops.append(op)
    return ops


def test_core_aten_opset_is_lowered():
    core = _core_overloads()
    assert len(core) >= 180, "torch.Tag.core set shrank; check the pinned torch version"
    missing = sorted(str(op) for op in core if not has_lowering(op))
    unexpected = [m for m in missing if m not in UNLOWERED_CORE]
    assert not unexpected, f"core ATen overloads without a lowering: {unexpected}"


# --------------------------------------------------------------- loud failures
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.nonzero(x),
        lambda x: x[x > 0],
        lambda x: torch.masked_select(x, x > 0),
        lambda x: torch.unique(x),
    ],
    ids=["nonzero", "boolean_mask_index", "masked_select", "unique"],
)
def test_data_dependent_shapes_fail_loudly(fn):
    with pytest.raises(Exception) as info:
        capture_step(fn, [], [torch.randn(8)])
    message = str(info.value)
    assert "depends on tensor values" in message or "value" in message
    assert "test_ops.py" in message  # names the user's line
