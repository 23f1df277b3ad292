"""The lowering families. Importing this package registers every lowering in the table."""

from jax_backend.ops import (  # noqa: F401  (imported for registration)
    attention,
    creation,
    elementwise,
    fft,
    indexing,
    linalg,
    nn,
    normalization,
    pooling,
    random,
    reduction,
    scalar,
    shape,
    special,
)
