"""1.9's ``cstorch.backend(...)`` and ``cstorch.save``: the 2.x backend with the two 1.9
keywords the Model Zoo passes.

* ``max_checkpoints=N`` (1.9 default 5 in the zoo): only the N newest checkpoint files
  written by ``save`` in this run are kept; older ones are deleted after each save, as the
  1.9 backend did.
* ``drop_data`` (CSX): 1.9's "do not send the data" switch, for measuring compute alone;
  here it must be false (the modeled wafer needs the data), and true is refused.
"""

from __future__ import annotations

import os

import cstorch

_max_checkpoints: int | None = None
_saved: list = []


def _forget() -> None:
    global _max_checkpoints
    _max_checkpoints = None
    _saved.clear()


cstorch.config.config.on_reset(_forget)  # cstorch.config.reset()


def backend(backend_type=None, *args, max_checkpoints=None, drop_data=False, **kwargs):
    global _max_checkpoints
    if backend_type is None:  # cstorch.backend(): the current one
        return cstorch.backend()
    if drop_data:
        raise ValueError(
            "drop_data=True is not modeled: the modeled wafer computes on the "
            "data it is sent. Leave runconfig.drop_data unset."
        )
    if max_checkpoints is not None and (
        not isinstance(max_checkpoints, int) or max_checkpoints < 1
    ):
        raise ValueError(f"max_checkpoints must be a positive int, got {max_checkpoints!r}.")
    created = cstorch.backend(backend_type, *args, **kwargs)
    _max_checkpoints = max_checkpoints
    _saved.clear()
    return created


def save(state_dict, checkpoint_file, *args, **kwargs):
    cstorch.save(state_dict, checkpoint_file, *args, **kwargs)
    path = os.path.abspath(str(checkpoint_file))
    if path in _saved:
        _saved.remove(path)
    _saved.append(path)
    while _max_checkpoints is not None and len(_saved) > _max_checkpoints:
        oldest = _saved.pop(0)
        if os.path.exists(oldest):
            os.remove(oldest)
