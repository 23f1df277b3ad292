"""``cstorch.sparse``: weight sparsity (cerebras-pytorch 2.10's API).

Algorithms: ``Static``, ``GMP``, ``SET``, ``RigL``, ``Group`` (per-parameter-name
algorithms), built directly or with ``configure(config)``; apply one with
``model.apply(sparsity)`` and ``optimizer.apply(sparsity)``. Each sparsified parameter gets a
``<name>_mask`` buffer; weights, gradients and optimizer state are pruned around every step,
and dynamic algorithms update their masks inside the compiled step on their schedule. The
mask maths is ``jax_backend.sparsity`` (pure JAX, usable directly).
"""

from cstorch.sparse import init, utils
from cstorch.sparse.base import SparseParameter as SparseParameter, SparsityAlgorithm
from cstorch.sparse.configure import configure, map_sparsity_algorithm
from cstorch.sparse.dynamic import DynamicSparsityAlgorithm
from cstorch.sparse.gmp import GMP
from cstorch.sparse.group import Group
from cstorch.sparse.rigl import RigL
from cstorch.sparse.set import SET
from cstorch.sparse.static import Static

__all__ = [
    "DynamicSparsityAlgorithm",
    "GMP",
    "Group",
    "RigL",
    "SET",
    "SparsityAlgorithm",
    "Static",
    "configure",
    "init",
    "map_sparsity_algorithm",
    "utils",
]
