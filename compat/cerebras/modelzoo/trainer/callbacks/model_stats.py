"""Counts the model's parameters once it is built."""

from __future__ import annotations

from cerebras.modelzoo.trainer.callbacks.callback import Callback


class CountParams(Callback):
    """Logs the number of parameters (total and trainable) and a per-module table."""

    def __init__(self, search_depth=1):
        if isinstance(search_depth, bool) or not isinstance(search_depth, int) or search_depth < 0:
            raise ValueError(f"search_depth must be a non-negative integer, got {search_depth!r}.")
        self.search_depth = search_depth
        self.total_params = None
        self.trainable_params = None
        self.table = []

    def post_setup(self, trainer):
        model = trainer.model
        self.total_params = sum(p.numel() for p in model.parameters())
        self.trainable_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.table = []
        for name, module in model.named_modules():
            depth = 0 if not name else name.count(".") + 1
            if 0 < depth <= self.search_depth:
                self.table.append(
                    (name, type(module).__name__, sum(p.numel() for p in module.parameters()))
                )
        trainer.logger.info(
            f"Model has {self.total_params:,} parameters ({self.trainable_params:,} trainable)."
        )
        for name, kind, count in self.table:
            trainer.logger.info(f"  {name} ({kind}): {count:,}")
