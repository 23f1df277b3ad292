"""The sparsity slot of the Trainer (``cstorch.sparse`` is not implemented on this engine)."""

from __future__ import annotations

from cerebras.modelzoo.trainer.callbacks.callback import Callback, CoreCallback


class SparsityCallback(CoreCallback):
    """Accepts ``sparsity=None``; a sparsity algorithm raises NotImplementedError, because
    ``cstorch.sparse`` does not exist in this implementation yet."""

    def __init__(self, sparsity=None):
        self.sparsity = sparsity

    def setup(self, trainer):
        trainer.sparsity = None
        if self.sparsity is not None:
            raise NotImplementedError(
                "Sparsity is not available: cstorch.sparse is not implemented on this engine. "
                "Remove `sparsity` from the Trainer arguments (or the YAML `init` section).")


class LogSparsity(Callback):
    """Would log per-parameter sparsity; requires ``cstorch.sparse`` (not implemented)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("LogSparsity needs cstorch.sparse, which is not implemented "
                                  "on this engine.")
