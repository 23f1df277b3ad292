"""Checks of a traced step's calls where a compiled step would give other numbers than eager
torch: each warns once, and its latch is its own.

* ``FrozenValueWarning``: a non-tensor argument changed after the step was traced with it (a
  constant of the graph).
* ``GradientAccumulationWarning``: the step computes gradients and nothing zeroes them
  between calls; eager torch would add them up, a compiled step starts from zero.
"""

from __future__ import annotations

import weakref

from jax_backend.user_frames import warn


class FrozenValueWarning(UserWarning):
    """A Python (non-tensor) argument of a traced step changed after compilation."""


class GradientAccumulationWarning(UserWarning):
    """A traced step computes gradients that nothing zeroes: eager torch would accumulate
    them across steps, a compiled step starts every step from zero gradients."""


class CallChecks:
    """The checks of one traced step's calls, and what each has warned about."""

    def __init__(self, step_fn):
        self._name = step_fn.__name__
        self._warned_frozen = False
        self._warned_accumulation = weakref.WeakSet()  # programs that warned (once each)
        self._resets_after_call = None  # the backend's zero_grad count after the last call

    def arguments(self, program, call) -> None:
        """Warns once when a non-tensor argument of ``call`` differs from what ``program``
        was traced with."""
        if self._warned_frozen:
            return
        changed = program.changed_argument(call)
        if changed is not None:
            self._warned_frozen = True
            warn(
                f"A non-tensor argument of {self._name!r} changed from {changed[0]!r} to "
                f"{changed[1]!r}, but the compiled step keeps the value it was traced with "
                "(Python values are constants of the graph). Pass values that change "
                "between steps as tensors.",
                FrozenValueWarning,
            )

    def gradients_zeroed(self, modes, program) -> None:
        """Warns once per program when a step that leaves its gradients un-zeroed is called
        again with no zero_grad in between (``modes``: the backend's ``ModesAndHooks``):
        eager torch would add the new gradients to the old ones."""
        resets = modes.gradient_resets
        previous, self._resets_after_call = self._resets_after_call, resets
        if (
            program.leaves_gradients
            and previous == resets
            and previous is not None
            and program not in self._warned_accumulation
        ):
            self._warned_accumulation.add(program)
            warn(
                f"{self._name!r} computes gradients (backward) but neither the step nor the "
                "code between its calls zeroes them (optimizer.zero_grad()). Eager torch "
                "would add each step's gradients to the previous step's; a compiled step "
                "starts every step from zero gradients (they do not persist between steps), "
                "so the numbers differ from eager torch's. Call optimizer.zero_grad() in the "
                "step, before backward; to accumulate gradients on purpose, use a larger "
                "batch.",
                GradientAccumulationWarning,
            )
