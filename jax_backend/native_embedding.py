"""The engine's CPU embedding: ``embedding``'s gather and ``embedding_dense_backward``'s
scatter-add as JAX FFI custom calls (``native/embedding.cc``) for a float32 table
(``cpu_embedding="native"``, the default).

Why: XLA's CPU compiler lowers the gather and the scatter-add, with the bounds checks their
semantics need, as about ten distinct kernels for ``bench_engine``'s transformer (its token and
position embeddings: the normalized index, the gathered rows, a NaN fill fused into each
consumer, the gradient's zeros, the checked indices, the scatters), each compiled on the
step's first run (``benchmarks/cpu_results.md``).

The numbers and semantics are ``ops.indexing``'s lowerings: forward, ``jnp.take``'s (an index
in ``[-rows, 0)`` counts from the end, any other outside the table gives a row of NaN, where
eager torch raises); backward, an index outside ``[0, rows)`` or equal to ``padding_idx`` adds
nothing, and each row of the gradient sums its contributions in the order of the indices, as
torch's CPU kernel does, whichever thread computes it (the same bits on every run).

Where: only in the engine's own program for one CPU device (``Target.native_ops``, which
``Program`` sets), for a float32 table and integer indices, without ``scale_grad_by_freq``;
an export, ``pure_function``, other platforms and other dtypes keep the XLA lowering, so a
torch-free artifact never names the custom call. Where the library is not built for the
running jaxlib, XLA's kernels run (``native`` falls back without a word).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_backend import config, ffi_libraries, target

LIBRARY = ffi_libraries.EMBEDDING
FORWARD_TARGET, BACKWARD_TARGET = (name for name, _ in LIBRARY.targets)
_INDEX_TYPES = (jnp.int32, jnp.int64)


def wanted(platform: str, layout) -> bool:
    """Whether a program for ``platform`` (on one device when ``layout`` is None) runs its
    float32 embeddings natively: a CPU with one device, ``cpu_embedding`` "native" and the
    library built for this jaxlib."""
    return LIBRARY.wanted(platform, layout, config.cpu_embedding)


def applies(table, indices) -> bool:
    """Whether the current lowering may gather rows of ``table`` (or scatter their gradient,
    ``table`` then being the gradient) at ``indices`` natively (``Target.native_ops``)."""
    return (
        "embedding" in target.current().native_ops
        and table.dtype == jnp.float32
        and indices.dtype in _INDEX_TYPES
    )


def forward(table, indices):
    """``embedding(table, indices)``: the rows of float32 ``table`` at ``indices``."""
    shape = tuple(indices.shape) + tuple(table.shape[1:])
    return LIBRARY.call(FORWARD_TARGET, jax.ShapeDtypeStruct(shape, jnp.float32))(table, indices)


def backward(grad_output, indices, num_weights: int, padding_idx: int):
    """``embedding_dense_backward`` without ``scale_grad_by_freq``: float32 ``grad_output``
    summed into a table of ``num_weights`` rows."""
    row = tuple(grad_output.shape[indices.ndim :])
    call = LIBRARY.call(BACKWARD_TARGET, jax.ShapeDtypeStruct((num_weights,) + row, jnp.float32))
    return call(grad_output, indices, padding_idx=np.int64(padding_idx))
