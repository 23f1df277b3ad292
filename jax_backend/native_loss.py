"""The engine's CPU classification loss: ``_log_softmax`` over the last dim, its backward, and
``nll_loss_forward``/``nll_loss_backward`` with a mean or sum, as JAX FFI custom calls
(``native/loss.cc``) on float32 rows (``cpu_loss="native"``, the default): what
``F.cross_entropy`` is made of after the capture.

Why: XLA's CPU compiler splits log-softmax into a max (fused into the logits' product), a sum
of exponentials, a log and a subtraction, its backward into another reduction, and the NLL's
pick, its two sums and its gradient's one-hot into half a dozen small kernels: about ten
distinct kernels for ``bench_engine``'s transformer loss, each compiled on the step's first
run (``benchmarks/cpu_results.md``).

The numbers: ``ops.reduction``'s and ``ops.nn``'s lowerings, operation by operation in
float32 (the library is built with ``-ffp-contract=off``), the same semantics (an ignored row
adds nothing; a class outside ``[0, C)`` makes its row's loss and gradient NaN), with the sums
in the order of torch's CPU kernels: a row's as ATen's 16-lane vector sum, the NLL's over the
rows as its cascade (so the loss is eager's float32 loss bit for bit where the log-probabilities
agree), each row on one thread (the same bits on every run whatever the threads); ``exp`` is a
polynomial within 2 units in the last place, as XLA's own is. On ``bench_engine``'s [2048,
1024] logits the log-probabilities differ from eager torch's in 0.2% of the elements (XLA's
lowering: 7%). ``tests/jax_backend/test_native_loss.py`` compares them with eager torch.

Where: only in the engine's own program for one CPU device (``Target.native_ops``, which
``Program`` sets), for float32 operands: log-softmax over the last dim, the NLL of [N, C] rows
with a mean or a sum; other dims, dtypes and reductions, an export, ``pure_function`` and
other platforms keep the XLA lowerings, so a torch-free artifact never names the custom
calls. Where the library is not built for the running jaxlib, XLA's kernels run (``native``
falls back without a word).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_backend import config, ffi_libraries, target

LIBRARY = ffi_libraries.LOSS
(
    LOG_SOFTMAX_TARGET,
    LOG_SOFTMAX_BACKWARD_TARGET,
    NLL_TARGET,
    NLL_BACKWARD_TARGET,
) = (name for name, _ in LIBRARY.targets)
#: The NLL's reductions the library takes (ops/nn.py's codes): mean and sum.
REDUCTIONS = (1, 2)
_CLASS_TYPES = (jnp.int32, jnp.int64)


def wanted(platform: str, layout) -> bool:
    """Whether a program for ``platform`` (on one device when ``layout`` is None) runs its
    float32 log-softmax and NLL natively: a CPU with one device, ``cpu_loss`` "native" and the
    library built for this jaxlib."""
    return LIBRARY.wanted(platform, layout, config.cpu_loss)


def _on() -> bool:
    return "loss" in target.current().native_ops


def log_softmax_applies(x, axis: int) -> bool:
    """Whether the current lowering may run a log-softmax of ``x`` over ``axis`` natively."""
    return _on() and x.dtype == jnp.float32 and x.ndim >= 1 and axis == x.ndim - 1


def nll_applies(x, target_classes, weight, reduction: int) -> bool:
    """Whether the current lowering may run the NLL of ``x`` natively: [N, C] float32 rows,
    integer classes, float32 weights or none, a mean or a sum."""
    return (
        _on()
        and x.ndim == 2
        and x.dtype == jnp.float32
        and target_classes.dtype in _CLASS_TYPES
        and (weight is None or weight.dtype == jnp.float32)
        and reduction in REDUCTIONS
    )


def log_softmax(x):
    return LIBRARY.call(LOG_SOFTMAX_TARGET, jax.ShapeDtypeStruct(x.shape, jnp.float32))(x)


def log_softmax_backward(grad, output):
    result = jax.ShapeDtypeStruct(output.shape, jnp.float32)
    return LIBRARY.call(LOG_SOFTMAX_BACKWARD_TARGET, result)(grad, output)


def _nll_operands(x, target_classes, weight, reduction: int, ignore_index: int):
    """What the forward and the backward share: the rows' classes (``_nll_rows``' choice: the
    first N of the flattened target), the weights (none: an empty array) and the attributes."""
    classes = target_classes.reshape(-1)[: x.shape[0]]
    weights = jnp.zeros((0,), jnp.float32) if weight is None else weight
    attributes = dict(reduction=np.int64(reduction), ignore_index=np.int64(ignore_index))
    return classes, weights, attributes


def nll_loss(x, target_classes, weight, reduction: int, ignore_index: int):
    """``(loss, total_weight)``, both float32 scalars."""
    classes, weights, attributes = _nll_operands(x, target_classes, weight, reduction, ignore_index)
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    loss, total_weight = LIBRARY.call(NLL_TARGET, (scalar, scalar))(
        x, classes, weights, **attributes
    )
    return loss, total_weight


def nll_loss_backward(grad_output, x, target_classes, weight, reduction, ignore_index, total):
    """The NLL's gradient for a float32 ``grad_output`` (a scalar)."""
    classes, weights, attributes = _nll_operands(x, target_classes, weight, reduction, ignore_index)
    call = LIBRARY.call(NLL_BACKWARD_TARGET, jax.ShapeDtypeStruct(x.shape, jnp.float32))
    total = total.reshape(()).astype(jnp.float32)
    return call(grad_output.reshape(()), x, classes, weights, total, **attributes)
