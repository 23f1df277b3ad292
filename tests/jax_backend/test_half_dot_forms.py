"""bf16 matrix products on the CPU whose operands come from transposes (``ops.linalg``,
``interpreter``): every ``nn.Linear`` multiplies by ``w.t()``, and its weight gradient by
``dy.t()``. A transposed operand is folded into the dot's dimension numbers (XLA's CPU library
dots refuse the column-major view a transpose becomes, and widened such bf16 dots to float32);
the leading-dims form of a weight gradient takes an operand through the engine's layout copy
(``cpu_half_dots="native"``; ``test_layout_copy.py``), or runs on torch's bf16 kernel where the
program may call torch's kernels (``"torch"``). The numbers are eager torch's: equal but for a
rare last-bit difference from the order of the sums, and bit for bit where torch's kernel
runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jax_backend import GraphInterpreter, capture_step, dtypes
from jax_backend.ops import torch_kernels
from jax_backend.target import Target, lowering_for
from tests.lowered import lowered

# name: (function, input shapes)
CASES = {
    "linear": (lambda x, w: torch.mm(x, w.t()), ((64, 96), (48, 96))),
    "weight_gradient": (lambda dy, x: torch.mm(dy.t(), x), ((64, 48), (64, 96))),
    "double_transpose": (lambda x, w: torch.mm(x, w.t().t()), ((64, 96), (96, 48))),
    "linear_with_bias": (lambda b, x, w: torch.addmm(b, x, w.t()), ((48,), (64, 96), (48, 96))),
    "attention_scores": (
        lambda q, k: torch.bmm(q, k.transpose(1, 2)),
        ((4, 24, 32), (4, 40, 32)),
    ),
    "batched_left_transpose": (
        lambda q, v: torch.bmm(q.permute(0, 2, 1), v),
        ((4, 32, 24), (4, 32, 40)),
    ),
    "baddbmm_transpose": (
        lambda b, q, k: torch.baddbmm(b, q, k.transpose(-1, -2)),
        ((4, 24, 40), (4, 24, 32), (4, 40, 32)),
    ),
}
CPU = Target("cpu")
HALF_DOT_KERNELS = Target("cpu", torch_kernels=frozenset({"half_dot"}))
LAYOUT_COPIES = Target("cpu", layout_copies=True)


def _inputs(case, dtype=torch.bfloat16):
    torch.manual_seed(0)
    return [torch.randn(*shape).to(dtype) for shape in CASES[case][1]]


def _graph(case, inputs):
    return capture_step(CASES[case][0], [], list(inputs)).graph


def _run(case, inputs, target):
    program, args = lowered(CASES[case][0], inputs, target)
    (out,) = program(args)
    return dtypes.array_to_tensor(np.asarray(out))


def _dot_operands_from_transposes(case, inputs, target) -> int:
    """How many operands of the lowered graph's dots are a transpose's result."""
    interpreter = GraphInterpreter(_graph(case, inputs))
    arrays = [dtypes.tensor_to_array(x) for x in inputs]
    with lowering_for(target):
        jaxpr = jax.make_jaxpr(lambda args: interpreter.run(args))(arrays).jaxpr
    transposed = {v for e in jaxpr.eqns if e.primitive.name == "transpose" for v in e.outvars}
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    return sum(v in transposed for e in dots for v in e.invars)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(
    "target",
    [CPU, HALF_DOT_KERNELS, LAYOUT_COPIES],
    ids=["xla", "torch_half_dots", "layout_copies"],
)
def test_bf16_products_of_transposes_give_eagers_numbers(case, target):
    inputs = _inputs(case)
    eager = CASES[case][0](*inputs).float()
    ours = _run(case, inputs, target)
    assert ours.dtype == torch.bfloat16
    ours = ours.float()
    # Equal, up to one bf16 step on a rare element (XLA sums in its own order).
    step = torch.finfo(torch.bfloat16).eps * eager.abs().clamp_min(1e-3)
    assert ((ours - eager).abs() <= step).all()
    assert (ours == eager).double().mean() >= 0.99


@pytest.mark.parametrize("case", sorted(CASES))
def test_bf16_dots_take_the_transposes_sources(case):
    """No bf16 dot reads a transpose's result; float32 dots still do (their lowering, and so
    their program, is unchanged)."""
    assert _dot_operands_from_transposes(case, _inputs(case), CPU) == 0
    if case != "double_transpose":  # (two transposes and no fold: XLA cancels them)
        assert _dot_operands_from_transposes(case, _inputs(case, torch.float32), CPU) > 0


def test_weight_gradient_form_runs_torchs_kernel_bit_for_bit():
    inputs = _inputs("weight_gradient")
    with torch_kernels.counting() as calls:
        ours = _run("weight_gradient", inputs, HALF_DOT_KERNELS)
    assert calls == [1]
    assert torch.equal(ours, CASES["weight_gradient"][0](*inputs))


@pytest.mark.parametrize("case", sorted(set(CASES) - {"weight_gradient"}))
def test_other_forms_and_other_targets_stay_in_xla(case):
    """Only 2-D bf16 products over both leading dims call torch's kernel; the other forms
    already run on XLA's bf16 library dots, and without the kind in the target (a GPU, an
    export, the setting off) or for float32 nothing calls torch."""
    with torch_kernels.counting() as calls:
        _run(case, _inputs(case), HALF_DOT_KERNELS)
        _run("weight_gradient", _inputs("weight_gradient"), CPU)
        _run("weight_gradient", _inputs("weight_gradient", torch.float32), HALF_DOT_KERNELS)
    assert calls == [0]


def test_half_dot_kernel_reads_a_read_only_numpy_operand():
    """Older JAX hands a callback read-only numpy arrays; numpy has no bfloat16 of its own,
    so the operand crosses to torch as its bits, unchanged."""
    a = np.asarray(jnp.arange(12, dtype=jnp.bfloat16).reshape(4, 3))
    a.flags.writeable = False
    tensor = torch_kernels._to_torch(a)
    assert tensor.dtype == torch.bfloat16
    assert torch.equal(tensor, torch.arange(12, dtype=torch.bfloat16).reshape(4, 3))
    assert np.array_equal(torch_kernels._to_host(tensor), a)
