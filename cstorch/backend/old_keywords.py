"""Backend keywords of releases 2.0 to 2.2 that later releases moved or dropped, as their Model
Zoo passes them to ``cstorch.backend(...)``:

* ``max_checkpoints`` (CPU and CSX, 2.0/2.1): the backend keeps only the newest N checkpoints
  that ``cstorch.save`` wrote while it is the backend, deleting older ones (None keeps all);
* ``micro_batch_size`` (CSX): now ``cstorch.backends.csx.performance.micro_batch_size``;
* ``use_cs_grad_accum`` (CSX, 2.0/2.1): False turned micro-batching off
  (``micro_batch_size=None``); True, the default, changes nothing;
* ``retrace_every_iteration`` (CSX): now ``cstorch.backends.csx.debug.retrace_every_iteration``;
* ``drop_data`` (CSX, 2.0): now ``cstorch.backends.csx.debug.drop_data``.

Each is taken out of the keywords and applied; the backend itself never sees them.
"""

from __future__ import annotations

import os

from jax_backend.errors import CstorchTypeError, CstorchValueError
from jax_backend.user_frames import warn

_CSX_ONLY = ("micro_batch_size", "use_cs_grad_accum", "retrace_every_iteration", "drop_data")


def apply(backend_type, kwargs: dict) -> tuple[dict, int | None]:
    """``(kwargs without the old keywords, max_checkpoints)``, after applying the rest."""
    from cstorch.backends import backends

    kwargs = dict(kwargs)
    max_checkpoints = kwargs.pop("max_checkpoints", None)
    if max_checkpoints is not None and (
        not isinstance(max_checkpoints, int)
        or isinstance(max_checkpoints, bool)
        or max_checkpoints < 1
    ):
        raise CstorchValueError(
            f"max_checkpoints must be a positive integer or None, got {max_checkpoints!r}."
        )
    if backend_type.is_csx:
        if "micro_batch_size" in kwargs:
            value = kwargs.pop("micro_batch_size")
            if value is not None:
                backends.csx.performance.micro_batch_size = value
        if kwargs.pop("use_cs_grad_accum", True) is False:
            backends.csx.performance.micro_batch_size = None
        for name in ("retrace_every_iteration", "drop_data"):
            if name in kwargs:
                setattr(backends.csx.debug, name, bool(kwargs.pop(name)))
    else:
        for name in _CSX_ONLY:
            if name in kwargs:
                raise CstorchTypeError(
                    f"The {backend_type.name} backend does not take {name!r} "
                    "(a CSX backend setting)."
                )
    return kwargs, max_checkpoints


class CheckpointKeeper:
    """Deletes all but the newest ``limit`` checkpoints saved through ``cstorch.save``."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.saved: list[str] = []

    def saved_checkpoint(self, path: str) -> None:
        if self.limit is None:
            return
        path = os.path.abspath(path)
        if path in self.saved:
            self.saved.remove(path)
        self.saved.append(path)
        while len(self.saved) > self.limit:
            old = self.saved.pop(0)
            try:
                os.remove(old)
            except FileNotFoundError:
                pass
            except OSError as error:
                warn(f"max_checkpoints: could not delete old checkpoint {old}: {error}")
