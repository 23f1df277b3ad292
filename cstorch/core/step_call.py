"""One call of a traced step, as the program table, the capture and the run see it.

A ``StepCall`` is built once per call (``StepCall.of``): the backend the step runs on, its
arguments flattened (``leaves``, ``spec``) and the state as it is (``view``, the backend's
``StateView``). The program table derives the call's signature from it
(``programs.ProgramTable.lookup``), a capture traces the step for it
(``step_capture.capture``) and the run feeds its tensors to the program (``step_run``). It
never changes: when a capture changes the state (a torch optimizer adopted, state born in the
step) the step goes on with ``with_current_state()``.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch.utils import _pytree as pytree


@dataclasses.dataclass(frozen=True, eq=False)
class StepCall:
    """A traced step's call: its backend, flattened arguments and state view."""

    backend: object  # the backend implementation (cstorch.backend.base_backend.BaseBackend)
    leaves: tuple  # the arguments (args, kwargs), flattened
    spec: pytree.TreeSpec
    view: object  # the backend's StateView when the call started (or after a capture)

    @classmethod
    def of(cls, backend, args, kwargs) -> StepCall:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        return cls(backend, tuple(leaves), spec, backend.state_view())

    def with_current_state(self) -> StepCall:
        """The same call on the state as it is now (a capture registered or created state)."""
        return dataclasses.replace(self, view=self.backend.state_view())

    @functools.cached_property
    def tensor_positions(self) -> tuple:
        """Indices of the tensor leaves: the program's inputs, in this order."""
        return tuple(i for i, x in enumerate(self.leaves) if isinstance(x, torch.Tensor))

    @functools.cached_property
    def python_leaves(self) -> tuple:
        """The non-tensor leaves, None where a tensor is: constants of a traced graph."""
        return tuple(None if isinstance(x, torch.Tensor) else x for x in self.leaves)

    def arguments(self, tensors) -> tuple:
        """``(args, kwargs)`` with ``tensors`` in place of the tensor leaves (a trace's)."""
        rebuilt = list(self.leaves)
        for i, tensor in zip(self.tensor_positions, tensors):
            rebuilt[i] = tensor
        return pytree.tree_unflatten(rebuilt, self.spec)
