"""The engine's layout copy: the transpose of an array's last two dims as a native JAX FFI
custom call (``native/layout_copy.cc``), which feeds XLA's CPU dots the operand form their
fast kernels take (``cpu_half_dots="native"``, the default).

Why: XLA's CPU compiler gives every transpose the column-major layout of its source instead
of copying it, and its library dots (YNNPACK) take a bfloat16 left operand only row-major and
contracted over its last dim; any other bfloat16 dot it widens to float32 and runs through
Eigen at half the speed. That is the form of every weight gradient (``xᵀ·dy``) and of the
attention's backward products (``pᵀ·dO``, ``dsᵀ·q``). XLA's own transposes cannot be forced
into a copy (an optimization barrier between them is folded into the same layout); a custom
call's result is row-major and opaque to it. So ``linalg`` copies the smaller operand
transposed, and XLA runs the product in bfloat16 (a 2048x256 by 2048x1024 weight gradient:
5.9 ms widened, 3.7 with the copy; the copy itself ~0.1 ms).

Where: only in the engine's own program for one CPU device (``Target.layout_copies``, which
``Program`` sets): an export, ``pure_function`` and the default target keep XLA's lowering,
so a torch-free artifact never names the custom call. The library is built per jaxlib
(``tools/build_native.py``, run by ``make``; its ABI is jaxlib's FFI headers); where it is not
built for the running jaxlib, ``cpu_half_dots="native"`` falls back to ``"torch"``.

What it changes: where an operand lives, not its values; the dot's products are the same,
accumulated in float32 by XLA's kernel instead of Eigen's, so sums may differ in order (the
last bit of a rare element). The program names the custom call by its target name and
nothing of the process, so the persistent compilation cache keeps it.
"""

from __future__ import annotations

import functools

import jax
import jaxlib

from jax_backend import config, ffi_libraries, target
from jax_backend.errors import CstorchRuntimeError

LIBRARY = ffi_libraries.LAYOUT_COPY
#: The FFI target names the programs call: the transpose, and the plain row-major copy.
TARGET, ROW_MAJOR_TARGET = (name for name, _ in LIBRARY.targets)


@functools.lru_cache(maxsize=1)
def xla_keeps_bf16_dots() -> bool:
    """Whether this jaxlib's CPU compiler runs a row-major bfloat16 dot in bfloat16 (its
    library dots; jaxlib 0.10 does, 0.7 widens every bfloat16 dot to float32, where a copy
    gains nothing). Compiles one 16x16 product, once per process."""
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    x = jax.ShapeDtypeStruct((16, 16), jax.numpy.bfloat16, sharding=cpu)
    product = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jax.numpy.float32))
    return widened_dots(product.lower(x, x).compile().as_text() or "") == 0


def widened_dots(compiled_text: str) -> int:
    """The dots of a compiled CPU program (its optimized HLO text) that XLA widened: those
    left outside its library fusions with converted operands, which run through Eigen."""
    return sum(" dot(" in line and "convert" in line for line in compiled_text.splitlines())


def unavailable() -> str | None:
    """Why ``cpu_half_dots="native"`` cannot copy operands in this process (None: it can)."""
    why = LIBRARY.unavailable()
    if why is None and not xla_keeps_bf16_dots():
        why = (
            f"jaxlib {jaxlib.__version__}'s CPU compiler widens every bfloat16 dot to float32, "
            "so a layout copy gains nothing"
        )
    return why


def wanted(platform: str, layout) -> bool:
    """Whether a program for ``platform`` (on one device when ``layout`` is None) feeds its
    half-precision dots through the layout copy: a CPU with one device, ``cpu_half_dots``
    "native", the library built for this jaxlib, and XLA's bfloat16 dots to feed."""
    return (
        platform == "cpu"
        and layout is None
        and config.cpu_half_dots.value == "native"
        and unavailable() is None
    )


def applies() -> bool:
    """Whether the current lowering may copy a dot's operand (``Target.layout_copies``)."""
    return target.current().layout_copies


def swap_last_two(x):
    """``x`` with its last two dims swapped, as a row-major copy XLA cannot fold into a
    layout (2- or 4-byte elements). Registers the custom call on first use."""
    return _copy(TARGET, tuple(x.shape[:-2]) + (x.shape[-1], x.shape[-2]), x)


def row_major(x):
    """``x`` as a row-major copy XLA cannot fold into a layout: what a batched half dot needs
    of an operand that is a transpose of its batch dims (attention's query, key and value,
    split into heads), which XLA otherwise widens to float32. Registers the custom call on
    first use."""
    return _copy(ROW_MAJOR_TARGET, x.shape, x)


def _copy(target_name: str, shape, x):
    """The custom call ``target_name`` on ``x``, giving ``shape`` in ``x``'s dtype (the library
    loaded and its targets registered first)."""
    why = LIBRARY.unavailable()
    if why is not None:
        raise CstorchRuntimeError(f"the engine's layout copy cannot run: {why}")
    return jax.ffi.ffi_call(target_name, jax.ShapeDtypeStruct(shape, x.dtype))(x)
