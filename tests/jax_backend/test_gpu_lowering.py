"""Lowering choices made for the GPU, checked on CPU.

* Half-precision matmuls give half results (the GEMM writes bf16, as torch autocast's does)
  while accumulating in fp32: on CPU, XLA's result is exactly the fp32 product rounded once.
* fp32 dots follow torch's float32 matmul precision (full by default; TF32 on request).
* Attention: which implementation each call gets on each platform, and the program lowered
  for an NVIDIA GPU (``lowering_platforms=("cuda",)``, with cuDNN's version checks answered
  as a GPU machine would) calls cuDNN's fused forward once and its backward once per layer.
  Where cuDNN is asked for but absent, XLA computes the same numbers, with a warning.
"""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from jax_backend import GraphInterpreter, Policy, Program, Slot, capture_step, dtypes, target
from jax_backend.ops import attention
from jax_backend.ops.linalg import aten_mm
from tests.models import TinyGPT, lm_loss

aten = torch.ops.aten


def _gpt_program(policy, platform, layers=2, heads=2, d=64, seq=16):
    """A forward+backward step of a small GPT, captured under ``policy``."""
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=d, heads=heads, layers=layers, seq=seq)
    params = dict(model.named_parameters())
    slots = [Slot(params, name) for name in params]

    def step(x, y):
        loss = lm_loss(model(x), y)
        loss.backward()
        return loss, [p.grad for p in model.parameters()]

    x, y = torch.randint(0, 64, (2, seq)), torch.randint(0, 64, (2, seq))
    captured = capture_step(step, slots, [x, y], policy)
    return (
        Program(captured, policy, platform=platform),
        [p.detach() for p in params.values()],
        [x, y],
    )


def _lowered_text(program, platforms=None):
    donated, kept = program.split_state(program.state_specs())
    traced = program._jitted.trace(donated, kept, program.input_specs(), np.int64(0))
    if platforms is None:
        return traced.lower().as_text()
    return traced.lower(lowering_platforms=platforms).as_text()


def _dot_result_types(stablehlo: str) -> collections.Counter:
    return collections.Counter(
        m.group(1)
        for m in re.finditer(r"stablehlo\.dot_general .*-> tensor<[^>]*x(\w+)>", stablehlo)
    )


# ------------------------------------------------------------------------- mixed precision
@pytest.mark.parametrize("platform", ["cpu", "any"])
def test_half_matmul_gives_half_result_accumulated_in_fp32(platform):
    rng = np.random.default_rng(0)
    a32 = rng.standard_normal((8, 4096)).astype(np.float32)
    b32 = rng.standard_normal((4096, 8)).astype(np.float32)
    a = torch.from_numpy(a32).bfloat16()
    b = torch.from_numpy(b32).bfloat16()
    with target.lowering_for(target.Target(platform)):
        jaxed = jax.jit(aten_mm)(dtypes.tensor_to_array(a), dtypes.tensor_to_array(b))
    assert jaxed.dtype == jnp.bfloat16
    # The exact product of the bf16 operands, rounded once to bf16: what an fp32 accumulator
    # gives (4096 terms accumulated in bf16 would be off by many bf16 steps).
    exact = a.double() @ b.double()
    once = exact.float().bfloat16()
    ours = dtypes.array_to_tensor(jaxed)
    assert torch.equal(ours, once)
    # torch's own bf16 matmul on this CPU: the same up to the fp32 summation order.
    torch.testing.assert_close(ours, a @ b, rtol=8e-3, atol=0)


@pytest.mark.slow
def test_bf16_step_dots_write_bf16_on_a_gpu_except_attention_scores():
    # A GPU without cuDNN (attention by XLA): every GEMM writes bf16.
    program, _, _ = _gpt_program(Policy("bfloat16"), "rocm")
    types = _dot_result_types(_lowered_text(program, ("rocm",)))
    # 2 layers x 4 linears + tied head, forward and two backward products each: bf16.
    assert types["bf16"] >= 27, types
    # What stays fp32 is attention's inside (scores and their gradients), as in torch's kernels.
    assert types["f32"] <= 6, types
    # On CPU, where XLA computes half dots in fp32 anyway, the lowering asks for fp32 and
    # converts (the conversion fuses into what follows); the values are the same.
    cpu, _, _ = _gpt_program(Policy("bfloat16"), "cpu")
    assert set(_dot_result_types(_lowered_text(cpu))) == {"f32"}


def test_fp32_dots_follow_torch_float32_matmul_precision():
    highest, _, _ = _gpt_program(Policy(), "cpu", layers=1)
    precisions = collections.Counter(
        re.findall(r"precision = \[(\w+), \w+\]", _lowered_text(highest))
    )
    assert set(precisions) == {"HIGHEST"} and precisions["HIGHEST"] >= 9
    tf32, _, _ = _gpt_program(Policy(float32_matmul="high"), "cpu", layers=1)
    precisions = collections.Counter(re.findall(r"precision = \[(\w+), \w+\]", _lowered_text(tf32)))
    assert set(precisions) == {"HIGH"}, precisions


def test_policy_reads_torch_float32_matmul_setting():
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert target.torch_float32_matmul() == "high"
        torch.set_float32_matmul_precision("highest")
        assert target.torch_float32_matmul() == "highest"
    finally:
        torch.set_float32_matmul_precision(previous)
    with pytest.raises(ValueError, match="float32_matmul"):
        Policy(float32_matmul="tf32")


# ------------------------------------------------------------------------------ attention
def _spec(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


GPT2 = _spec((8, 12, 1024, 64))


@pytest.mark.parametrize(
    "platform,q,mask,causal,setting,expected",
    [
        ("cuda", GPT2, None, True, "auto", "cudnn"),
        ("cuda", _spec((8, 12, 1024, 64), jnp.float16), None, False, "auto", "cudnn"),
        ("cuda", _spec((2, 4, 128, 96)), _spec((128, 128)), False, "auto", "cudnn"),  # float mask
        ("cuda", GPT2, None, True, "xla", "xla"),  # ruled out by CSTORCH_ATTENTION=xla
        ("cpu", GPT2, None, True, "auto", "xla"),
        ("rocm", GPT2, None, True, "auto", "xla"),
        ("any", GPT2, None, True, "auto", "xla"),
        ("cuda", _spec((8, 12, 1024, 64), jnp.float32), None, True, "auto", "xla"),  # fp32
        ("cuda", _spec((8, 12, 1024, 160)), None, True, "auto", "xla"),  # head dim > 128
        ("cuda", _spec((8, 12, 1024, 60)), None, True, "auto", "xla"),  # not a multiple of 8
        ("cuda", GPT2, _spec((1024, 1024), jnp.bool_), False, "auto", "xla"),  # bool mask
        ("cuda", _spec((12, 1024, 64)), None, True, "auto", "xla"),  # 3-D
    ],
)
def test_attention_selection(platform, q, mask, causal, setting, expected):
    assert attention.choose(platform, q, q, q, mask, causal, 0.0, setting) == expected


def test_attention_selection_refuses_what_cudnn_computes_differently():
    q, kv = _spec((2, 4, 64, 64)), _spec((2, 4, 128, 64))
    assert "causal" in attention.cudnn_unsupported(q, kv, kv, None, True)
    assert attention.cudnn_unsupported(q, kv, kv, None, False) is None
    assert "dropout" in attention.cudnn_unsupported(GPT2, GPT2, GPT2, dropout_p=0.1)
    gqa = _spec((8, 4, 1024, 64))
    assert attention.cudnn_unsupported(GPT2, gqa, gqa) is None  # grouped-query attention
    with pytest.warns(attention.AttentionFallbackWarning, match="float32"):
        f32 = _spec((2, 4, 64, 64), jnp.float32)
        assert attention.choose("cuda", f32, f32, f32, setting="cudnn") == "xla"


@pytest.fixture
def cudnn_as_on_a_gpu(monkeypatch):
    """Answers cuDNN's trace-time version checks as a Hopper machine with cuDNN 9.10 would."""
    fused = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
    if not hasattr(fused, "check_cudnn_version"):
        pytest.skip("this JAX checks cuDNN differently")
    monkeypatch.setattr(fused, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(fused, "check_compute_capability", lambda capability: True, raising=False)
    monkeypatch.setattr(
        fused, "is_cuda_compute_capability_equal", lambda capability: False, raising=False
    )


def test_cuda_program_calls_cudnn_forward_and_backward_once_per_layer(cudnn_as_on_a_gpu):
    program, _, _ = _gpt_program(Policy("bfloat16"), "cuda", layers=2)
    text = _lowered_text(program, ("cuda",))
    calls = collections.Counter(re.findall(r"custom_call @(__cudnn\$\w+)", text))
    # The backward reuses the forward's VJP: no second forward kernel per layer.
    assert calls == {"__cudnn$fmhaSoftmax": 2, "__cudnn$fmhaSoftmaxBackward": 2}, calls
    # No score matrix left: every remaining dot is a linear layer's, in bf16.
    assert set(_dot_result_types(text)) == {"bf16"}


def test_cuda_fp32_program_keeps_xla_attention(cudnn_as_on_a_gpu):
    program, _, _ = _gpt_program(Policy(), "cuda", layers=1)
    assert "__cudnn" not in _lowered_text(program, ("cuda",))


@pytest.mark.slow
def test_without_cudnn_a_cuda_program_falls_back_to_the_same_numbers():
    """A program lowered for "cuda" where cuDNN cannot be loaded (here: a CPU) runs XLA's
    attention, with a warning, and gives what a GPU program without cuDNN gives."""
    portable, state, inputs = _gpt_program(Policy("bfloat16"), "any")
    cuda, _, _ = _gpt_program(Policy("bfloat16"), "cuda")
    arrays = [dtypes.tensor_to_array(t) for t in state]
    batch = [dtypes.tensor_to_host(t) for t in inputs]
    expected = portable(arrays, batch)
    with pytest.warns(attention.AttentionFallbackWarning, match="cuDNN"):
        got = cuda(arrays, batch)
    for a, b in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.mark.slow
def test_attention_backward_without_its_forward_recomputes_it():
    """The backward op on its own (its forward not in the same graph run) is still right."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 8, 16, requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    expected = torch.autograd.grad(out, (q, k, v), grad)
    arrays = [dtypes.tensor_to_array(t.detach()) for t in (grad, q, k, v, out)]
    got = attention.aten_sdpa_flash_cpu_backward(*arrays, None, 0.0, True)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), e.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_gradients_match_eager_torch(dtype):
    """Forward and backward ops of one call, captured and run together (the backward takes
    the forward's VJP), against eager torch's flash attention on this CPU."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, 16, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.randn(32, 32, dtype=dtype)
    grad = torch.randn(2, 4, 32, 16, dtype=dtype)

    def fn(q, k, v, mask, grad):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return (out,) + torch.autograd.grad(out, (q, k, v), grad)

    expected = fn(q, k, v, mask, grad)
    captured = capture_step(fn, [], [q, k, v, mask, grad])
    ops = {n.target for n in captured.graph.graph.nodes}
    assert aten._scaled_dot_product_flash_attention_for_cpu_backward.default in ops
    interpreter = GraphInterpreter(captured.graph, strict=True)
    arrays = [dtypes.tensor_to_array(t.detach()) for t in (q, k, v, mask, grad)]
    got = jax.jit(lambda a: interpreter.run(a))(arrays)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for g, e in zip(got, expected):
        torch.testing.assert_close(dtypes.array_to_tensor(g), e.detach(), **tol)


@pytest.mark.slow
def test_a_cudnn_program_that_fails_to_compile_is_rebuilt_with_xla_attention(cudnn_as_on_a_gpu):
    """Here cuDNN's kernels have no CPU lowering, as a cuDNN refusing the call at compile time
    would fail: the program is compiled again with XLA's attention, before anything ran."""
    portable, state, inputs = _gpt_program(Policy("bfloat16"), "any")
    cuda, _, _ = _gpt_program(Policy("bfloat16"), "cuda")
    arrays = [dtypes.tensor_to_array(t) for t in state]
    batch = [dtypes.tensor_to_host(t) for t in inputs]
    expected = portable(arrays, batch)
    with pytest.warns(attention.AttentionFallbackWarning, match="compiled again"):
        got = cuda(arrays, batch)
    assert cuda.target.attention == "xla"
    for a, b in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
