"""Step-aware hyperparameters, update schedules, score shapers and mask helpers of
``cstorch.sparse``.

Hyperparameter schedules (``Constant``, ``Linear``, ``Exp``, ``Power``, ``Cosine``,
``Cycling``, ``Lambda``) map an int64 step tensor to a float32 value with torch ops, so inside
a traced step they become part of the compiled program. Update schedules (``FreqSchedule``,
``ListSchedule``) map the step to a bool tensor saying whether masks change at that step.

The mask helpers (``make_mask_topk_sparsity``, ``make_mask_drop_minimum``,
``make_mask_grow_maximum``) call the ``cstorch::sparse_*`` custom ops, whose meaning is the
pure JAX code of ``jax_backend.sparsity``; the number of kept elements is a tensor, so a
changing sparsity never recompiles the step.

Differences from cerebras-pytorch 2.10 (on purpose): an unknown schedule ``type`` raises
ValueError (the reference called ``None``), and a callable ``update`` is accepted (the
reference raised NameError).
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from typing import Callable, Dict, List, Tuple, Union

import torch

import jax_backend.sparse_ops  # noqa: F401  (registers the cstorch::sparse_* ops)
from jax_backend.errors import CstorchValueError


def _step_tensor(step) -> torch.Tensor:
    return step if isinstance(step, torch.Tensor) else torch.tensor(step, dtype=torch.float)


def _f32(value) -> torch.Tensor:
    return torch.tensor(float(value), dtype=torch.float32)


# ------------------------------------------------------------------- hyperparameter schedules
class HyperParameterSchedule(ABC):
    """A step-aware hyperparameter: ``schedule(step)`` is a float32 tensor.

    ``update(is_update_step)`` advances internal state (only ``Cycling`` has any) at most once
    per mask update; ``cache_clear()`` re-arms it for the next step.
    """

    def __init__(self):
        self._updated = False

    @abstractmethod
    def compute(self, step: torch.Tensor) -> torch.Tensor:
        """The value at ``step`` (an int64 tensor or a number)."""

    def __call__(self, step) -> torch.Tensor:
        return self.compute(step)

    def update(self, is_update_step: torch.Tensor) -> None:
        """Advances the schedule's state where ``is_update_step`` (once per step)."""
        if not getattr(self, "_updated", False):
            self._updated = True
            self._advance(is_update_step)

    def _advance(self, is_update_step: torch.Tensor) -> None:
        """State change of one update (none by default)."""

    def cache_clear(self) -> None:
        self._updated = False

    def visit_state(self, fn) -> None:
        """Applies ``fn`` to each state tensor (replacing it where ``fn`` returns one)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def get_min_max_end(self, begin: int, end: int) -> Tuple[float, float, float]:
        """``(min, max, value at end)`` over ``[begin, end]``, assuming monotonic values."""
        first = float(self(torch.tensor(begin)))
        last = float(self(torch.tensor(end)))
        return (first, last, last) if first < last else (last, first, last)


class Constant(HyperParameterSchedule):
    """The same value at every step."""

    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def compute(self, step):
        return _f32(self.value)


class Linear(HyperParameterSchedule):
    """``init + step * slope``."""

    def __init__(self, init: float, slope: float):
        super().__init__()
        self.init = torch.tensor(init)
        self.slope = torch.tensor(slope)

    def compute(self, step):
        return self.init + _step_tensor(step) * self.slope


class Exp(HyperParameterSchedule):
    """``final - (final - init) * exp(step * gamma)``: approaches ``final``."""

    def __init__(self, init: float, gamma: float, final: float = 1):
        super().__init__()
        self.final = torch.tensor(final)
        self.scale = self.final - torch.tensor(init)
        self.gamma = torch.tensor(gamma)

    def compute(self, step):
        return self.final - self.scale * torch.exp(_step_tensor(step) * self.gamma)


class Power(HyperParameterSchedule):
    """``init * beta ** step``."""

    def __init__(self, init: float, beta: float):
        super().__init__()
        self.init = torch.tensor(init)
        self.beta = torch.tensor(beta)

    def compute(self, step):
        return self.init * torch.pow(self.beta, _step_tensor(step))


class Cosine(HyperParameterSchedule):
    """Oscillates from ``init`` down to ``minimum`` and back every ``2 * half_period`` steps:
    ``o + a * cos(step * pi / half_period)`` with ``o = (init + minimum) / 2``, ``a = init - o``.
    """

    def __init__(self, init: float, half_period: float, minimum: float = 0.0):
        super().__init__()
        offset = (minimum + init) / 2
        self.amp = torch.tensor(init - offset)
        self.offset = torch.tensor(offset)
        self.freq = torch.tensor(math.pi / half_period)

    def compute(self, step):
        return self.amp * torch.cos(_step_tensor(step) * self.freq) + self.offset

    def get_min_max_end(self, begin, end):
        low, high = float(self.offset - self.amp), float(self.offset + self.amp)
        return min(low, high), max(low, high), float(self(torch.tensor(end)))


class Cycling(HyperParameterSchedule):
    """Cycles through ``values``, moving to the next one at every mask update.

    Its position (``index``, int64) is state: it is checkpointed in the algorithm's
    ``state_dict`` and carried between compiled steps."""

    def __init__(self, values: List[float]):
        super().__init__()
        if not values:
            raise CstorchValueError("Cycling needs at least one value to cycle through.")
        self.values = list(values)
        self._state = {"index": torch.tensor(0, dtype=torch.int64)}
        _register_state(self)

    @property
    def index(self) -> torch.Tensor:
        return self._state["index"]

    @index.setter
    def index(self, value) -> None:
        self._state["index"] = value

    def compute(self, step):
        value = torch.tensor(float(self.values[0]))
        for i, v in enumerate(self.values):
            value = torch.where(self.index == i, torch.tensor(float(v)), value)
        return value

    def _advance(self, is_update_step):
        last = len(self.values) - 1
        following = torch.where(self.index == last, torch.zeros_like(self.index), self.index + 1)
        self.index = torch.where(is_update_step, following, self.index)

    def get_min_max_end(self, begin, end):
        return min(self.values), max(self.values), self.values[-1]

    def visit_state(self, fn):
        new = fn(self.index)
        if new is not None:
            self.index = new

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        index = state["index"]
        self.index = torch.as_tensor(index, dtype=torch.int64).clone()

    def _cstorch_state_slots(self):
        from jax_backend import Slot

        return [Slot(self._state, "index")]


class Lambda(HyperParameterSchedule):
    """``fn(step)``, a user function of the int64 step tensor returning a tensor."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.fn = fn

    def compute(self, step):
        return torch.as_tensor(self.fn(step), dtype=torch.float32)

    def get_min_max_end(self, begin, end):
        return None


HyperParameterScheduleType = Union[
    int, float, List[int], List[float], Tuple, Dict, Callable, HyperParameterSchedule
]

_SCHEDULES = {
    "constant": Constant,
    "linear": Linear,
    "exp": Exp,
    "power": Power,
    "cosine": Cosine,
    "cycling": Cycling,
    "lambda": Lambda,
}


def make_hyperparam_schedule(schedule):
    """A ``HyperParameterSchedule`` from a number (Constant), a list (Cycling), a callable of
    the step (Lambda), a schedule object (as is) or a dict ``{"type": name, **arguments}``."""
    if isinstance(schedule, HyperParameterSchedule):
        return schedule
    if isinstance(schedule, bool):
        raise CstorchValueError(f"A sparsity hyperparameter cannot be a bool, got {schedule!r}.")
    if isinstance(schedule, (int, float)):
        return Constant(schedule)
    if isinstance(schedule, (list, tuple)):
        return Cycling(schedule)
    if isinstance(schedule, dict):
        arguments = dict(schedule)
        name = arguments.pop("type", None)
        if not name:
            raise CstorchValueError(
                f"A schedule dict must name its `type` (one of {sorted(_SCHEDULES)}), got "
                f"{schedule!r}."
            )
        cls = _SCHEDULES.get(str(name).lower())
        if cls is None:
            raise CstorchValueError(
                f"Unknown schedule type {name!r}; valid types are {sorted(_SCHEDULES)}."
            )
        try:
            return cls(**arguments)
        except TypeError as err:
            raise CstorchValueError(f"Invalid arguments for a {name!r} schedule: {err}") from None
    if callable(schedule) and _takes_one_argument(schedule):
        return Lambda(schedule)
    raise CstorchValueError(
        f"Unhandled schedule {schedule!r}. Options are: a number (constant), a list of numbers "
        f"(cycling), a function of the step tensor (lambda), a HyperParameterSchedule, or a "
        f'dict {{"type": ...}} with type one of {sorted(_SCHEDULES)}.'
    )


def _takes_one_argument(fn) -> bool:
    try:
        inspect.signature(fn).bind(None)
    except (TypeError, ValueError):
        return False
    return True


# ------------------------------------------------------------------------- update schedules
class UpdateSchedule(ABC):
    """Maps the int64 step tensor to a 0-dim bool tensor: is this a mask-update step?"""

    @abstractmethod
    def is_update_step(self, step: torch.Tensor) -> torch.Tensor:
        """Whether masks are updated at ``step``."""

    def __call__(self, step):
        return self.is_update_step(step)


class FreqSchedule(UpdateSchedule):
    """Every ``freq`` steps from ``start`` (inclusive) until ``stop`` (exclusive)."""

    def __init__(self, freq=1, start=0, stop=None):
        super().__init__()
        if not isinstance(freq, int) or isinstance(freq, bool) or freq <= 0:
            raise CstorchValueError(f"The update `freq` must be a positive int, got {freq!r}.")
        self.start = start
        self.freq = freq
        self.stop = stop

    def is_update_step(self, step):
        step = torch.as_tensor(step)
        offset = step - self.start if self.start else step
        result = offset % self.freq == 0
        if self.start:
            result = result & (step >= self.start)
        if self.stop is not None:
            result = result & (step < self.stop)
        return result


class ListSchedule(UpdateSchedule):
    """At each of the listed ``steps``."""

    def __init__(self, steps: Union[List[int], torch.Tensor]):
        super().__init__()
        steps = tuple(int(s) for s in steps)
        if not steps:
            raise CstorchValueError("ListSchedule needs at least one update step.")
        self.steps = steps
        self.start = min(steps)
        self.stop = max(steps)

    def is_update_step(self, step):
        step = torch.as_tensor(step)
        result = torch.zeros((), dtype=torch.bool)
        for s in self.steps:
            result = result | (step == s)
        return result


UpdateScheduleType = Union[Dict, Callable[[torch.Tensor], torch.Tensor]]


def make_update_schedule(update):
    """An update schedule from None (every step), ``{"freq", "start", "stop"}``,
    ``{"steps": [...]}``, an ``UpdateSchedule`` or a function of the step tensor."""
    if isinstance(update, UpdateSchedule):
        return update
    if update is None:
        return FreqSchedule(freq=1)
    if isinstance(update, dict):
        if "freq" in update:
            unknown = set(update) - {"freq", "start", "stop"}
            if not unknown:
                return FreqSchedule(**update)
        elif "steps" in update and set(update) == {"steps"}:
            return ListSchedule(update["steps"])
    elif callable(update) and _takes_one_argument(update):
        return update
    raise CstorchValueError(
        f"Invalid `update`: {update!r}. Valid options are: None (update every step), "
        '{"freq": freq, "start": start, "stop": stop}, {"steps": [step, ...]}, or a function '
        "of the step tensor returning a bool tensor."
    )


# ----------------------------------------------------------------------------- score shapers
class ScoreShaper(ABC):
    """Reshapes a score (or mask) so that its last dimension holds independent competitions;
    returns ``(reshaped, unshape)``."""

    @abstractmethod
    def __call__(self, tensor: torch.Tensor): ...


class ScoreFlattener(ScoreShaper):
    """One global competition over all elements (unstructured sparsity)."""

    def __call__(self, tensor):
        shape = tensor.shape
        return tensor.reshape(-1), lambda out: out.reshape(shape)


class OutputGroupScoreShaper(ScoreShaper):
    """A ``[G*o, i]`` weight scored as ``G`` balanced rows of ``o*i`` elements."""

    def __init__(self, num_groups):
        self.num_groups = num_groups

    def __call__(self, tensor):
        shape = tensor.shape
        return tensor.reshape(self.num_groups, -1), lambda out: out.reshape(shape)


class InputGroupScoreShaper(ScoreShaper):
    """A ``[o, G*i]`` weight scored as ``G`` balanced groups of ``o*i`` elements
    (column blocks)."""

    def __init__(self, num_groups):
        self.num_groups = num_groups

    def __call__(self, tensor):
        rows, cols = tensor.shape
        shaped = tensor.permute(1, 0).reshape(self.num_groups, -1)
        return shaped, lambda out: out.reshape(cols, rows).permute(1, 0).contiguous()


def _rows(score, score_shaper):
    """``score`` shaped into a 2-D ``[groups, n]`` tensor, and the map back."""
    shaped, unshape = (score_shaper or ScoreFlattener())(score)
    flat_shape = shaped.shape
    rows = shaped.reshape(-1, flat_shape[-1]) if shaped.dim() else shaped.reshape(1, 1)
    return rows, lambda out: unshape(out.reshape(flat_shape))


def _spec(rows: torch.Tensor) -> str:
    return f"out:{rows.shape[0]}"


def _when(when) -> torch.Tensor:
    return torch.ones((), dtype=torch.bool) if when is None else torch.as_tensor(when).bool()


# ``when`` (not in the reference): a bool tensor; where it is false the helpers skip the work
# and return a placeholder, which a dynamic algorithm's where(is_update_step, ...) discards.
def make_mask_topk_sparsity(score, sparsity, score_shaper=None, *, when=None) -> torch.Tensor:
    """A bool mask keeping the highest ``(1 - sparsity)`` fraction of ``score`` (per group):
    ``int((1 - sparsity) * n)`` elements."""
    rows, unshape = _rows(score, score_shaper)
    sparsity = torch.as_tensor(sparsity, dtype=torch.float32)
    return unshape(
        torch.ops.cstorch.sparse_topk_mask(rows, sparsity, _when(when), _spec(rows), _topk_ties())
    )


def _topk_ties() -> str:
    """Which of equal scores a top-k keeps: on the CPU backend the ones ``torch.topk`` keeps,
    as the reference's CPU path does (it decides which pruned weights regrow); elsewhere the
    lower index first (the reference's CSX path sorts instead)."""
    from cstorch.backend import current_backend_impl

    impl = current_backend_impl(raise_exception=False)
    return "torch_cpu" if impl is not None and impl.backend_type.is_cpu else "lower_index"


def make_mask_drop_minimum(score, mask, drop_fraction, score_shaper=None, *, when=None):
    """``(mask without the lowest-scoring drop_fraction of its connections, kept count)``."""
    rows, unshape = _rows(score, score_shaper)
    mask_rows, _ = _rows(mask, score_shaper)
    drop_fraction = torch.as_tensor(drop_fraction, dtype=torch.float32)
    new, kept = torch.ops.cstorch.sparse_drop_minimum(
        rows, mask_rows, drop_fraction, _when(when), _spec(rows)
    )
    return unshape(new), kept


def make_mask_grow_maximum(
    score, mask, sparsity, mask_nonzero=None, score_shaper=None, *, when=None
):
    """``mask`` plus the highest-scoring pruned positions, up to ``int((1 - sparsity) * n)``
    connections per group (never fewer than ``mask`` has)."""
    rows, unshape = _rows(score, score_shaper)
    mask_rows, _ = _rows(mask, score_shaper)
    sparsity = torch.as_tensor(sparsity, dtype=torch.float32)
    if mask_nonzero is None:
        mask_nonzero = mask.sum()
    mask_nonzero = torch.as_tensor(mask_nonzero).to(torch.int32)
    return unshape(
        torch.ops.cstorch.sparse_grow_maximum(
            rows, mask_rows, sparsity, mask_nonzero, _when(when), _spec(rows)
        )
    )


def _register_state(obj) -> None:
    """Carries ``obj``'s state tensors between compiled steps (when a backend exists)."""
    from cstorch.backend import current_backend_impl

    impl = current_backend_impl(raise_exception=False)
    if impl is not None:
        impl.register_stateful(obj)
