"""Applies ``cstorch.nn.SelectiveGrad`` gradient masks to chosen parameters."""

from __future__ import annotations

import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.callback import Callback


class SelectiveGrad(Callback):
    """``SelectiveGrad(selective_grads)``: a dict (or list of dicts) with ``param_filter``
    (name globs; default: every weight of dimension > 1) and optional ``init_method``."""

    def __init__(self, selective_grads):
        if isinstance(selective_grads, dict):
            selective_grads = [selective_grads]
        if not isinstance(selective_grads, (list, tuple)) or not all(
            isinstance(item, dict) for item in selective_grads
        ):
            raise ValueError("Expected `selective_grads` to be a dict or a list of dicts.")
        self.selective_grads = []
        for item in selective_grads:
            unknown = set(item) - {"param_filter", "init_method"}
            if unknown:
                raise ValueError(
                    f"Unknown SelectiveGrad keys {sorted(unknown)}; expected "
                    "param_filter and init_method."
                )
            args = [item.get("param_filter", _default_filter)]
            if "init_method" in item:
                args.append(item["init_method"])
            self.selective_grads.append(cstorch.nn.SelectiveGrad(*args))

    def setup(self, trainer):
        for selective_grad in self.selective_grads:
            trainer.model.apply(selective_grad)


def _default_filter(name, param) -> bool:
    return param.dim() > 1 and "embedding" not in name and "norm" not in name
