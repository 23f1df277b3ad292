"""Names and codes fixed by the cerebras-pytorch H5 checkpoint format (version 0.5).

Every string here is read or written verbatim by cerebras-pytorch 2.10, so none of them may change.
"""

import numpy as np
import torch

from jax_backend.errors import CstorchValueError, quoted

# Root attributes.
__SPEC__ = "__spec__"
__METADATA__ = "__metadata__"
__OBJECTS__ = "__objects__"
__TYPE__ = "__TYPE__"
__VERSION__ = "__version__"
__CSTORCH_VERSION__ = "__cstorch_version__"
__SUCCESS__ = "__SUCCESS__"

CURRENT_CKPT_FORMAT_VERSION = 0.5
#: What ``__cstorch_version__`` says in files we write: the release whose format we follow.
CSTORCH_VERSION = "2.10.0"

# Per-leaf metadata flags: exactly one of NONE / NUMPY / BYTES says where the value lives.
NONE_FLAG = "__NONE__"
NUMPY_FLAG = "__NUMPY__"
BYTES_FLAG = "__BYTES__"
TORCH_FLAG = "__TORCH__"
LINKED_FLAG = "__LINKED__"
RTFX_FLAG = "__RTFX__"
LEGACY_H5_TYPE = "__H5_TYPE__"

# The HDF5 filter id of LZ4 (registered by hdf5plugin); options (0,) = default block size.
LZ4_FILTER_ID = 32004
LZ4_FILTER_OPTS = (0,)

# Serializer class names written into ``__TYPE__``.
TORCH_TENSOR = "TorchTensorSerializer"
SCALAR = "ScalarSerializer"
STRING = "StringSerializer"
NONE = "NoneSerializer"
NUMPY_ARRAY = "NumpyArraySerializer"
OBJECT = "ObjectSerializer"
LINKED = "LinkedObject"

#: RtFx element-type codes (``rtfx_dtypes``) of the torch dtypes the format can store.
#: int8, complex and float8 have no code: the reference raises ValueError for them and so do we.
RTFX_CODES = {
    torch.bool: 1,
    torch.int16: 3,
    torch.int32: 4,
    torch.int64: 5,
    torch.uint8: 6,
    torch.uint16: 7,
    torch.uint32: 8,
    torch.uint64: 9,
    torch.float16: 10,
    torch.float32: 11,
    torch.float64: 12,
    torch.bfloat16: 15,
}
RTFX_TO_TORCH = {code: dtype for dtype, code in RTFX_CODES.items()}

#: The numpy dtype a torch dtype is stored as. bfloat16 is stored as its int16 bit pattern.
TORCH_TO_NUMPY = {
    torch.bool: np.dtype(np.bool_),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.bfloat16: np.dtype(np.int16),
}

#: The appliance's bfloat16 numpy dtype: int16 bits tagged by dtype metadata.
BF16_NUMPY = np.dtype("i2", metadata={"is_bfloat16": True, "is_cerebras": True})


def is_bf16_numpy(dtype: np.dtype) -> bool:
    """True for the appliance's tagged-int16 bfloat16 dtype and for ml_dtypes' ``bfloat16``."""
    if dtype.name == "bfloat16":
        return True
    metadata = dtype.metadata or {}
    return dtype in (np.int16, np.uint16) and bool(metadata.get("is_bfloat16"))


def torch_dtype_from_name(name: str) -> torch.dtype:
    """``"torch.float32"`` -> ``torch.float32``; anything else is a corrupt file."""
    module, _, attr = str(name).partition(".")
    dtype = getattr(torch, attr, None) if module == "torch" else None
    if not isinstance(dtype, torch.dtype):
        raise CstorchValueError(f"unknown torch dtype name {quoted(name)} in checkpoint metadata")
    return dtype
