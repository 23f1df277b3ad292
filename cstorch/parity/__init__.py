"""Parity runs: one unchanged cstorch script on several engines, compared step by step.

``python -m cstorch.parity [options] script.py [script args...]`` runs the script once per
engine, each in its own process (JAX's thread pools would slow eager torch sharing a process):
eager torch (the reference's own CPU behaviour, ``engine="eager"``), JAX on CPU, and JAX on
GPU when JAX sees one; ``--engines eager,csx`` compares the modeled wafer (run in float32
unless ``--csx-mixed-precision``). Each engine's backend serves every ``cstorch.backend(...)``
of the script (``cstorch.config``'s ``serve_backend``). Every value passed to a step or
checkpoint closure is recorded by step, as is every model's and optimizer's final state
(``torch.optim`` ones included), through public hooks (``cstorch.backend.run_hooks``). The tool prints the per-step values side by
side with their relative differences, the first step past tolerance and the largest final
state difference, and exits 1 past tolerance (2 if an engine failed), so it can gate CI.

Each engine runs in its own empty working directory (files the script writes to fixed relative
paths neither collide nor feed the next engine; arguments naming existing files are passed as
absolute paths; ``--shared-workdir`` runs them all here). Tolerances follow the precision a
value was computed in (``runner.RTOL_BY_PRECISION``: float32 1e-4, float16 2e-3, bfloat16 1e-2,
final state ten times that) unless ``--rtol``/``--state-rtol`` are given. Final state past its
tolerance is judged against what the reference engine itself cannot reproduce: the reference
runs once more with its parameters moved by one rounding step, and tensors that rerun changes
as much (rounding noise, ``runner.NOISE_DOMINATED``/``NOISE_FACTOR``) are named, not failed.
A divergence comes with
its likely causes: random ops in the compiled step, half-precision rounding, a step that does
not zero its gradients (eager torch accumulates them, a compiled step cannot).
"""

import importlib

# Loaded on first use: ``python -m cstorch.parity.record`` (each engine's process) must find
# the record module not yet imported by this package, or runpy warns.
_EXPORTS = {
    "compare_closures": "compare",
    "compare_state": "compare",
    "first_divergence": "compare",
    "table": "compare",
    "ENGINES": "runner",
    "available_engines": "runner",
    "main": "runner",
    "run_engine": "runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"cstorch.parity.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'cstorch.parity' has no attribute {name!r}")
