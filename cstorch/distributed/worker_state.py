"""The per-worker dataloader state handed to a restartable dataloader's ``state_dict``."""

from __future__ import annotations

from jax_backend.errors import CstorchRuntimeError


class WorkerState:
    """Holds the ``DataLoaderCheckpoint`` of the current worker until it is fetched once."""

    _state = None

    @classmethod
    def configure(cls, worker_ckpt) -> None:
        """Installs ``worker_ckpt`` (the ``DataLoaderCheckpoint`` the cstorch dataloader
        builds for this worker) for the next ``get_worker_state()``."""
        cls._state = worker_ckpt

    @classmethod
    def get_worker_state(cls):
        """Returns the configured state and clears it (a second call raises RuntimeError)."""
        state, cls._state = cls._state, None
        if state is None:
            raise CstorchRuntimeError(
                "Unable to fetch the worker state: `cstorch.distributed.get_worker_state()` must "
                "be called only once, inside your dataloader's implementation of `state_dict` "
                "(or `load_state_dict`)."
            )
        return state
