"""The engine's JAX FFI libraries: custom calls written in C++ (``native/<name>.cc``), built by
``tools/build_native.py`` (run by ``make native``) and loaded, their targets registered with
JAX, on first use.

* ``LAYOUT_COPY``: the row-major operands XLA's bfloat16 dots need (``ops.layout_copy``).
* ``TORCH_CONVOLUTIONS``: torch's own CPU convolution kernels called from the compiled step
  (``ops.torch_kernels``), without a host callback.
* ``FUSED_OPTIMIZER``: the Adam family's and SGD's update of a whole param group in one call
  (``native_optimizer``).
* ``LAYER_NORM``: layer norm's forward and backward, row by row (``native_layer_norm``).
* ``EMBEDDING``: the embedding's gather and its gradient's scatter-add (``native_embedding``).
* ``LOSS``: log-softmax and the NLL, forward and backward (``native_loss``).

A library's ABI is the FFI headers of the jaxlib it was compiled against, and for one that
links torch also torch's C++ ABI, so each (jaxlib, torch) gets its own file, named by their
versions; where none is built for the running versions, its ``unavailable()`` says why and
the lowering that would call it falls back (to the host callback, or XLA). A library is only
ever the project's own build under ``native/``: nothing here loads a path from elsewhere.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os

import jax
import jaxlib

from jax_backend import config
from jax_backend.errors import CstorchRuntimeError

#: Where the sources live and ``tools/build_native.py`` writes the libraries.
NATIVE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")


@dataclasses.dataclass(frozen=True)
class FfiLibrary:
    """One native library: ``native/<name>.cc``, exporting ``targets`` (FFI target name ->
    the handler symbol) for the CPU; ``links_torch``: built against torch's C++ library;
    ``flags``: compiler flags of its own."""

    name: str
    targets: tuple  # ((target name, symbol), ...)
    links_torch: bool = False
    flags: tuple = ()

    @property
    def source(self) -> str:
        return os.path.join(NATIVE_DIR, f"{self.name}.cc")

    def abi(self) -> str:
        """The versions the library is built for: the running jaxlib's (and torch's)."""
        tag = f"jaxlib{jaxlib.__version__}"
        if self.links_torch:
            import torch

            tag += f"-torch{torch.__version__}"
        return tag

    def path(self) -> str:
        """The library built for the running versions."""
        return os.path.join(NATIVE_DIR, f"_{self.name}-{self.abi()}.so")

    def unavailable(self) -> str | None:
        """Why the library's custom calls cannot run in this process (None: they can, and
        are registered). Loads it once per process."""
        return _load(self)

    def wanted(self, platform: str, layout, setting: config.Setting) -> bool:
        """Whether a program for ``platform`` (on one device when ``layout`` is None) calls
        the library: a CPU with one device, ``setting`` (a process-wide choice of ``native``
        or ``xla``) "native", and the library built for the running versions."""
        return (
            platform == "cpu"
            and layout is None
            and setting.value == "native"
            and self.unavailable() is None
        )

    def call(self, target: str, results, **options):
        """``jax.ffi.ffi_call`` of the library's ``target`` (loaded and registered first);
        raises naming the library where it cannot run."""
        why = self.unavailable()
        if why is not None:
            raise CstorchRuntimeError(f"the engine's {self.name} library cannot run: {why}")
        return jax.ffi.ffi_call(target, results, **options)


@functools.lru_cache(maxsize=None)
def _load(library: FfiLibrary) -> str | None:
    path = library.path()
    if not os.path.exists(path):
        return f"{path} is not built for {library.abi()} (run `make native`)"
    try:
        if library.links_torch:
            import torch  # noqa: F401  (its libraries first: the handlers call into them)
        handle = ctypes.CDLL(path)
        for target, symbol in library.targets:
            jax.ffi.register_ffi_target(
                target, jax.ffi.pycapsule(getattr(handle, symbol)), platform="cpu"
            )
    except (OSError, AttributeError, RuntimeError, ValueError) as error:
        # (a library built before a target was added: a checkout updated without a rebuild)
        return f"{path} cannot be loaded: {error} (rebuild it: `make native`)"
    return None


LAYOUT_COPY = FfiLibrary(
    "layout_copy",
    (
        ("cstorch_swap_last_two", "CstorchSwapLastTwo"),
        ("cstorch_row_major_copy", "CstorchRowMajorCopy"),
    ),
)
TORCH_CONVOLUTIONS = FfiLibrary(
    "torch_convolutions",
    (
        ("cstorch_torch_convolution", "CstorchTorchConvolution"),
        ("cstorch_torch_convolution_backward", "CstorchTorchConvolutionBackward"),
    ),
    links_torch=True,
)
FUSED_OPTIMIZER = FfiLibrary(
    "fused_optimizer",
    (("cstorch_adam_update", "CstorchAdamUpdate"), ("cstorch_sgd_update", "CstorchSgdUpdate")),
    # Each float operation rounded on its own, as XLA's program of the same rule; sqrt as
    # an instruction (C's errno is never read).
    flags=("-ffp-contract=off", "-fno-math-errno"),
)
LAYER_NORM = FfiLibrary(
    "layer_norm",
    (
        ("cstorch_layer_norm", "CstorchLayerNorm"),
        ("cstorch_layer_norm_backward", "CstorchLayerNormBackward"),
    ),
    # Each float operation rounded on its own, as XLA's program of the same maths; sqrt as an
    # instruction (C's errno is never read).
    flags=("-ffp-contract=off", "-fno-math-errno"),
)
EMBEDDING = FfiLibrary(
    "embedding",
    (
        ("cstorch_embedding", "CstorchEmbedding"),
        ("cstorch_embedding_backward", "CstorchEmbeddingBackward"),
    ),
    flags=("-ffp-contract=off",),
)
LOSS = FfiLibrary(
    "loss",
    (
        ("cstorch_log_softmax", "CstorchLogSoftmax"),
        ("cstorch_log_softmax_backward", "CstorchLogSoftmaxBackward"),
        ("cstorch_nll_loss", "CstorchNllLoss"),
        ("cstorch_nll_loss_backward", "CstorchNllLossBackward"),
    ),
    flags=("-ffp-contract=off", "-fno-math-errno"),
)
LIBRARIES = (LAYOUT_COPY, TORCH_CONVOLUTIONS, FUSED_OPTIMIZER, LAYER_NORM, EMBEDDING, LOSS)
