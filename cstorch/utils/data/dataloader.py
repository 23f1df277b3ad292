"""``cstorch.utils.data.DataLoader``: a lazily built wrapper around the user's input function."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import itertools
import warnings
from typing import Any, Dict, Protocol, runtime_checkable

import torch

from cstorch.utils.data.utils import infer_batch_size
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError
from jax_backend.user_frames import warn

_ids = itertools.count(1)


@runtime_checkable
class RestartableDataLoader(Protocol):
    """A dataloader whose position can be saved at checkpoints and restored."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state_dict, strict=True) -> None: ...

    def aggregate_state_dict(self, worker_states) -> dict: ...

    def deaggregate_state_dict(self, aggregated_state_dict, strict=True) -> dict: ...


def _argument_name(value) -> str:
    """How a message calls the object given: ``loader`` for a torch DataLoader, else
    ``batches``."""
    return "loader" if isinstance(value, torch.utils.data.DataLoader) else "batches"


@dataclasses.dataclass
class DataLoaderCheckpoint:
    """A worker's position in the run, handed to a restartable dataloader's ``state_dict``
    through ``cstorch.distributed.get_worker_state()``.

    ``appliance_step``/``worker_step`` count the steps streamed so far (equal with one worker
    per system) and ``samples_streamed`` the samples.
    """

    local_worker_id: int
    num_workers_per_csx: int
    num_csx: int
    wse_id: int
    appliance_step: int
    worker_step: int
    samples_streamed: int
    user_state_dict: Dict[str, Any]

    @property
    def global_worker_id(self) -> int:
        return self.wse_id * self.num_workers_per_csx + self.local_worker_id

    @property
    def total_num_workers(self) -> int:
        return self.num_workers_per_csx * self.num_csx


class DataLoader:
    """Wraps ``input_fn(*args, **kwargs)``, which returns an iterable of batches.

    The arguments are deep-copied now and again each time the loader is built, so changing
    the originals later has no effect. The loader is built on first use.
    """

    STATE_UNKNOWN = object()
    STATE_UNAVAILABLE = object()
    #: The run context of this loader's last run when Ctrl-C stopped it between two steps
    #: (``cstorch.utils.data.interrupts``), else None: ``state_dict`` then gives the position
    #: after that run's last step, in the loop's ``except KeyboardInterrupt``.
    interrupted_run = None

    def __init__(self, input_fn, *args, **kwargs):
        if not callable(input_fn):
            hint = (
                " To use a loader or dataset you already made, pass a function that returns "
                f"it: cstorch.utils.data.DataLoader(lambda: {_argument_name(input_fn)})."
                if hasattr(input_fn, "__iter__")
                else ""
            )
            raise CstorchTypeError(
                f"Expected input_fn to be callable (a function that builds the "
                f"loader or iterable of batches), got {type(input_fn).__name__}." + hint
            )
        self.id = next(_ids)
        self.input_fn = input_fn
        self.input_fn_params = (copy.deepcopy(args), copy.deepcopy(kwargs))
        self.batch_size = None
        self.cached_state = DataLoader.STATE_UNKNOWN

    @functools.cached_property
    def dataloader(self):
        args, kwargs = copy.deepcopy(self.input_fn_params)
        loader = self.input_fn(*args, **kwargs)
        if isinstance(loader, torch.utils.data.DataLoader):
            workers = loader.num_workers
            loader.num_workers = 0
            object.__setattr__(loader, "persistent_workers", False)
            if workers > 0:
                # Worker processes forked from a process running JAX (multithreaded) can
                # deadlock; the reference also feeds batches from the main process on CPU.
                warn(
                    f"The torch DataLoader returned by "
                    f"{getattr(self.input_fn, '__name__', 'input_fn')} asks for "
                    f"num_workers={workers}; cstorch loads its batches in the main process "
                    "(num_workers=0), as cerebras-pytorch does off the wafer. Make batches "
                    "cheap to produce, or prepare them ahead of time."
                )
                if loader.worker_init_fn is not None:
                    loader.worker_init_fn(0)
        return loader

    def restart(self) -> None:
        """Builds the loader again (calls ``input_fn`` anew) on next use."""
        self.__dict__.pop("dataloader", None)

    def __len__(self):
        return len(self.dataloader)

    @property
    def is_restartable(self) -> bool:
        return isinstance(self.dataloader, RestartableDataLoader)

    def _configure_worker_state(self, step: int) -> None:
        """Installs the single worker's state for ``get_worker_state()`` (step-based counts)."""
        from cstorch.distributed.worker_state import WorkerState

        samples = step * self.batch_size if step > 0 and self.batch_size else 0
        WorkerState.configure(
            DataLoaderCheckpoint(
                local_worker_id=0,
                num_workers_per_csx=1,
                num_csx=1,
                wse_id=0,
                appliance_step=step,
                worker_step=step,
                samples_streamed=samples,
                user_state_dict=None,
            )
        )

    def __iter__(self):
        from cstorch.backend import use_cs

        self._configure_worker_state(0)
        for batch in self.dataloader:
            size = infer_batch_size(batch)
            if not any(isinstance(t, torch.Tensor) for t in torch.utils._pytree.tree_leaves(batch)):
                raise CstorchRuntimeError(
                    "The dataloader yielded a batch that contains no tensors."
                )
            if self.batch_size is None:
                self.batch_size = size
            elif size != self.batch_size:
                message = (
                    f"Batch size changed from {self.batch_size} to {size}. A static "
                    "graph compiles one program per batch shape; use drop_last=True."
                )
                if use_cs():
                    raise CstorchRuntimeError(message)
                warnings.warn(message, stacklevel=2)
            yield batch

    # ------------------------------------------------------------------ restartability
    def _require_restartable(self):
        if not self.is_restartable:
            raise CstorchRuntimeError(
                f"The dataloader returned by {getattr(self.input_fn, '__name__', 'input_fn')} "
                "is not restartable: implement the cstorch.utils.data.RestartableDataLoader "
                "protocol (state_dict, load_state_dict, aggregate_state_dict, "
                "deaggregate_state_dict)."
            )

    def state_dict(self) -> dict:
        self._require_restartable()
        from cstorch.backend import current_backend_impl

        context = current_backend_impl().run_context
        if context is None and self.interrupted_run is not None:
            context = self.interrupted_run  # stopped by Ctrl-C after its last whole step
        elif context is None or not (
            context.is_checkpoint_step or context.is_pre_initial_step or context.is_final_step
        ):
            raise CstorchRuntimeError(
                "DataLoader state can only be requested at a checkpoint step (inside a "
                "checkpoint closure), before the first step, at the final step, or after "
                "Ctrl-C stopped the run (in its `except KeyboardInterrupt`)."
            )
        loader = self.dataloader
        self._configure_worker_state(context.user_iteration)
        state = copy.deepcopy(loader.aggregate_state_dict([loader.state_dict()]))
        self.cached_state = state
        return state

    def load_state_dict(self, state_dict, strict: bool = True) -> None:
        self._require_restartable()
        from cstorch.backend import current_backend_impl

        context = current_backend_impl().run_context
        if context is not None and not context.is_pre_initial_step:
            raise CstorchRuntimeError("DataLoader state can only be loaded before the run starts.")
        loader = self.dataloader
        takes_strict = [
            _accepts_strict(loader.load_state_dict),
            _accepts_strict(loader.deaggregate_state_dict),
        ]
        if takes_strict[0] != takes_strict[1]:
            raise CstorchTypeError(
                "Either both or neither of load_state_dict and deaggregate_state_dict of the "
                "dataloader must accept a `strict` argument."
            )
        kwargs = {"strict": strict} if takes_strict[0] else {}
        self._configure_worker_state(0)
        loader.load_state_dict(loader.deaggregate_state_dict(state_dict, **kwargs), **kwargs)


def _accepts_strict(method) -> bool:
    return "strict" in inspect.signature(method).parameters
