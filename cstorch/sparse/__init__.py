"""``cstorch.sparse`` (weight sparsity algorithms) is not implemented in this release.

cerebras-pytorch's sparsity keeps a mask per sparsified parameter, prunes weights, gradients
and optimizer state around every step, and (GMP, SET, RigL) recomputes the masks inside the
compiled step on a schedule. None of that exists here yet; every name of this module raises
NotImplementedError saying so, instead of silently training dense.
"""

__all__: list = []

_NAMES = ("SparsityAlgorithm", "Static", "DynamicSparsityAlgorithm", "GMP", "SET", "RigL",
          "Group", "configure", "map_sparsity_algorithm", "utils", "init")


def __getattr__(name):
    if name in _NAMES:
        raise NotImplementedError(
            f"cstorch.sparse.{name} is not implemented in this release: weight sparsity "
            "(masks, pruning hooks and scheduled mask updates inside compiled steps) is not "
            "available yet. Train dense, or prune explicitly with torch.nn.utils.prune.")
    raise AttributeError(f"module 'cstorch.sparse' has no attribute {name!r}")
