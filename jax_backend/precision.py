"""Precision policies: fp32 parameters with fp16/bf16 compute.

The policy is applied when the step is *captured*: the step runs under torch's autocast, so
the graph itself holds the casts — parameters are cast to the half dtype at their use,
matmuls and convolutions run in it, precision-sensitive ops (softmax, normalisation, losses)
stay in fp32 per torch's autocast lists, and gradients of fp32 parameters come back in fp32,
so the optimizer update is fp32. (A first design placed the policy in the lowering; capturing it
instead keeps torch's well-tested op lists and makes the graph's dtypes true, so the lowering
needs no second opinion.) Matmuls, convolutions and attention take half operands and give half
results, as autocast's kernels do, accumulating in fp32 inside: XLA upcasts half dots to fp32 on
CPU, and its GPU GEMMs (cuBLAS, Triton) and cuDNN kernels accumulate half products in fp32 and
write half results (``ops._common.dot_result_dtype``).

``float32_matmul`` is torch's float32 matmul setting (``torch.get_float32_matmul_precision()``,
which ``torch.backends.cuda.matmul.allow_tf32`` sets): "highest" (torch's default) keeps fp32
dots at full precision, as the CPU reference computes them; "high" lets a GPU use TF32 and
"medium" bf16 passes, which is the user's choice, as in torch. It is part of the policy so that
changing it compiles a new program.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from jax_backend.errors import CstorchValueError
from jax_backend.target import FLOAT32_MATMUL

HALF_DTYPES = ("float16", "bfloat16", "cbfloat16")


@dataclasses.dataclass(frozen=True)
class Policy:
    """``compute_dtype``: None (full precision) or "float16"/"bfloat16"/"cbfloat16" (traced as
    float16, held as cbfloat16 by the lowering: ``jax_backend.cbfloat16``); ``float32_matmul``:
    "highest", "high" or "medium" (see the module docstring)."""

    compute_dtype: str | None = None
    float32_matmul: str = "highest"

    def __post_init__(self):
        if self.compute_dtype not in (None,) + HALF_DTYPES:
            raise CstorchValueError(
                f"compute_dtype must be None or one of {HALF_DTYPES}, got {self.compute_dtype!r}."
            )
        if self.float32_matmul not in FLOAT32_MATMUL:
            raise CstorchValueError(
                f"float32_matmul must be one of {FLOAT32_MATMUL}, got {self.float32_matmul!r}."
            )

    @property
    def is_mixed(self) -> bool:
        return self.compute_dtype is not None

    def capture_context(self):
        """The context the step is traced under (torch autocast for mixed precision)."""
        if not self.is_mixed:
            return contextlib.nullcontext()
        half = "float16" if self.compute_dtype == "cbfloat16" else self.compute_dtype
        return torch.autocast("cpu", dtype=getattr(torch, half))
