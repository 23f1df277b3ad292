"""Comparing recorded runs: per-step closure values and final state, against a reference."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Row:
    step: int
    name: str
    values: list  # one float64 array (or None where the engine did not record it) per engine
    errors: list  # per non-reference engine: relative difference (inf when missing/misshaped)
    ok: list  # per non-reference engine: within tolerance


def relative_difference(reference, other) -> float:
    """``max |a - b| / max(|a|, |b|)`` elementwise (0 where both are 0; inf if shapes differ
    or a value is missing; a NaN counts as different unless both are NaN)."""
    if reference is None or other is None or reference.shape != other.shape:
        return float("inf")
    a, b = reference.astype(np.float64), other.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    diff = np.where(both_nan, 0.0, np.abs(a - b))
    scale = np.maximum(np.abs(a), np.abs(b))
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(diff == 0, 0.0, diff / scale)
    rel = np.where(np.isnan(rel), np.inf, rel)
    return float(rel.max()) if rel.size else 0.0


def within(reference, other, rtol: float, atol: float) -> bool:
    if reference is None or other is None or reference.shape != other.shape:
        return False
    a, b = reference.astype(np.float64), other.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    close = np.abs(a - b) <= atol + rtol * np.maximum(np.abs(a), np.abs(b))
    return bool(np.all(close | both_nan))


def compare_closures(runs: list, rtol, atol: float) -> list:
    """Rows for every (step, name) recorded by any engine; ``runs[0]`` is the reference.
    ``rtol`` is one tolerance, or a dict of them by ``(step, name)``."""
    keys = sorted({key for run in runs for key in run})
    rows = []
    for step, name in keys:
        values = [run.get((step, name)) for run in runs]
        reference = values[0]
        tolerance = rtol[(step, name)] if isinstance(rtol, dict) else rtol
        rows.append(
            Row(
                step,
                name,
                values,
                [relative_difference(reference, v) for v in values[1:]],
                [within(reference, v, tolerance, atol) for v in values[1:]],
            )
        )
    return rows


@dataclasses.dataclass
class StateDifference:
    name: str  # the tensor with the largest difference ("" when nothing was compared)
    max_abs: float  # max |a - b| over all tensors
    max_rel: float  # the largest per-tensor max|a - b| / max|a| (inf for missing tensors)
    missing: list  # tensors recorded by one engine only, or with different shapes
    relative: dict = dataclasses.field(default_factory=dict)  # that ratio, tensor by tensor

    def beyond(self, rtol: float) -> list:
        """The tensors whose relative difference exceeds ``rtol``."""
        return sorted(name for name, rel in self.relative.items() if rel > rtol)


def compare_state(reference: dict, other: dict) -> StateDifference:
    """The largest difference between two final states (name -> array), each tensor's
    relative difference, and the names only one of them has."""
    worst, max_abs, max_rel, missing, relative = "", 0.0, 0.0, [], {}
    for name in sorted(set(reference) | set(other)):
        a, b = reference.get(name), other.get(name)
        if a is None or b is None or a.shape != b.shape:
            missing.append(name)
            continue
        diff = float(np.max(np.abs(a - b))) if a.size else 0.0
        scale = float(np.max(np.abs(a))) if a.size else 0.0
        rel = 0.0 if diff == 0 else (diff / scale if scale else float("inf"))
        if np.isnan(diff):
            diff = rel = float("inf")
        relative[name] = rel
        if rel > max_rel or not worst:
            worst, max_rel = name, max(rel, max_rel)
        max_abs = max(max_abs, diff)
    return StateDifference(worst, max_abs, float("inf") if missing else max_rel, missing, relative)


def first_divergence(rows: list, engine: int):
    """The first row (by step) where engine ``engine`` (1-based among the compared) is out of
    tolerance, or None."""
    return next((row for row in rows if not row.ok[engine - 1]), None)


def _show(value) -> str:
    if value is None:
        return "-"
    if value.size == 1:
        return f"{float(value.reshape(())):.7g}"
    return f"[{value.size} values] max {float(np.max(np.abs(value))):.4g}"


def table(rows: list, engines: list) -> str:
    """Per-step values side by side with the relative difference of each engine."""
    header = ["step", "value"] + [engines[0]]
    for engine in engines[1:]:
        header += [engine, "rel diff"]
    lines = [header]
    for row in rows:
        line = [str(row.step), row.name, _show(row.values[0])]
        for value, error, ok in zip(row.values[1:], row.errors, row.ok):
            line += [_show(value), f"{error:.2e}" + ("" if ok else " !")]
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)
