"""Small helpers shared by the lowering families (argument normalisation, promotion)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_backend import dtypes, target


def canon_dim(dim: int, ndim: int) -> int:
    """Torch's dim wrapping: negative dims count from the end; 0-dim tensors accept 0/-1."""
    if ndim == 0:
        return 0
    return dim + ndim if dim < 0 else dim


def canon_dims(dims, ndim: int) -> tuple:
    """A reduction's dims: None or [] means every dim; a 0-dim tensor has no axes."""
    if dims is None or ndim == 0:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0 or ndim == 0:
        return tuple(range(ndim))
    return tuple(sorted({canon_dim(d, ndim) for d in dims}))


def ntuple(value, n: int) -> tuple:
    """An int-or-list argument (kernel size, stride, ...) as an ``n``-tuple; a one-element
    list is repeated, as torch does."""
    if isinstance(value, (list, tuple)):
        value = list(value)
        return tuple(value * n) if len(value) == 1 else tuple(value)
    return (value,) * n


def compute_dtype(x):
    """The dtype statistics and resampling of ``x`` are computed in: float32 for half inputs."""
    return opmath_dtype(x.dtype)


def opmath_dtype(dtype):
    """The dtype torch's kernels compute ``dtype`` in (their "opmath" type): float32 for the
    half types, else ``dtype`` itself."""
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def promote(*operands):
    """Casts operands to torch's common dtype; Python scalars become arrays of that dtype."""
    dtype = dtypes.result_jax_dtype(*operands)
    return [None if x is None else jnp.asarray(x, dtype=dtype) for x in operands]


def promote_to_float(*operands):
    """Like ``promote`` but integer/bool results become float32 (torch's int-to-float ops)."""
    dtype = dtypes.float_dtype_for(dtypes.result_jax_dtype(*operands))
    return [None if x is None else jnp.asarray(x, dtype=dtype) for x in operands]


def as_float(x):
    x = jnp.asarray(x)
    return x.astype(dtypes.float_dtype_for(x.dtype))


def jax_dtype(torch_dtype, default=None):
    if torch_dtype is None:
        return default
    return dtypes.to_jax_dtype(torch_dtype)


_FLOAT32_DOT_PRECISION = {
    "highest": lax.Precision.HIGHEST,
    "high": lax.Precision.HIGH,
    "medium": lax.Precision.DEFAULT,
}


def dot_precision(*arrays):
    """The precision of a dot: for fp32/fp64 operands, what torch's float32 matmul setting
    allows (full precision by default, so GPUs do not silently use TF32, as torch does not);
    half operands take XLA's default, whose GEMMs accumulate in fp32 and round the result to
    the half dtype, as torch's half matmuls do."""
    if any(a.dtype in (jnp.float32, jnp.float64, jnp.complex64, jnp.complex128) for a in arrays):
        return _FLOAT32_DOT_PRECISION[target.current().float32_matmul]
    return None


def dot_result_dtype(dtype):
    """The result dtype to ask of a dot or convolution of ``dtype`` operands (None: theirs).

    Half-precision products accumulate in fp32 on every platform and give half results, as
    torch's do; the question is only where the rounding to half happens. On a GPU the GEMM
    (cuBLAS, Triton) writes half itself, half the bytes of an fp32 result and no separate
    conversion. XLA on CPU computes half dots in fp32 and converts anyway; asking for fp32
    there and converting in the lowering lets that conversion fuse into what follows, which
    ran faster (a bf16 2-block transformer step: about 8% less CPU time). Same numbers."""
    if dtype in (jnp.float16, jnp.bfloat16) and target.current().platform == "cpu":
        return jnp.float32
    return None


def conv_precision(*arrays):
    """Convolutions keep fp32 at full precision whatever the matmul setting (torch governs
    them by ``torch.backends.cudnn.allow_tf32`` instead, which is on by default on a GPU:
    following it would lose parity with the CPU by default)."""
    if any(a.dtype in (jnp.float32, jnp.float64, jnp.complex64, jnp.complex128) for a in arrays):
        return lax.Precision.HIGHEST
    return None


def sum_dtype(x):
    """torch.sum of integers and bools accumulates in int64."""
    if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
        return jnp.int64
    return x.dtype


def normalized_shape(shape):
    return tuple(int(s) for s in shape)


def numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))
