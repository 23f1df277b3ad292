"""``cstorch.save`` / ``cstorch.load``: the cerebras-pytorch H5 checkpoint format (version 0.5).

A checkpoint is one HDF5 file: each tensor, numpy array or pickled leaf of the state dict is a
dataset named by its dotted key (``model.fc.weight``); scalars, strings and None live only in
metadata; the container structure and every leaf's metadata are JSON root attributes. Files
written here load in cerebras-pytorch 2.10 and the reverse (``tests/data/reference-2.10/``
holds checkpoints 2.10 wrote).

Modules, one concept each:

* :mod:`~cstorch.storage.save` / :mod:`~cstorch.storage.load`: the two entry points.
* :mod:`~cstorch.storage.treespec`: flattening, dotted keys, the treespec JSON.
* :mod:`~cstorch.storage.serializers`: how each leaf kind is stored and read back (public, as
  in the reference: deferred tensors and context flags).
* :mod:`~cstorch.storage.deferred`: tensors read from the file on first use.
* :mod:`~cstorch.storage.h5_format`: the HDF5 container, atomic writes, reads.
* :mod:`~cstorch.storage.safe_pickle`: pickled leaves and the allow-list unpickler.
* :mod:`~cstorch.storage.conversions`: tensor / JAX array / numpy conversions.
* :mod:`~cstorch.storage.legacy`: files of format < 0.5.
* :mod:`~cstorch.storage.safetensors_format`: a dependency-free safetensors reader/writer.
* :mod:`~cstorch.storage.cli`: ``python -m cstorch.storage info|convert``.

Safety: saving replaces the target atomically (``exist_ok=False`` refuses to) and never leaves a
half-written file at the target path;
loading never unpickles arbitrary objects unless called with ``unsafe_allow_pickle=True``, and
never opens a FIFO, socket or device (``NotARegularFileError``: it could block forever).
"""

from cstorch.storage import serializers, utils as utils
from cstorch.storage.load import load
from cstorch.storage.safe_pickle import UnsafePickleError
from cstorch.storage.save import save
from cstorch.storage.utils import to_deferred

# Readers refuse FIFOs, sockets and devices before opening them (one check for every layer).
from jax_backend.regular_files import (
    NotARegularFileError as NotARegularFileError,
    check_regular as check_regular,
)

__all__ = ["UnsafePickleError", "load", "save", "serializers", "to_deferred"]
