"""Parity runs: one unchanged cstorch script on several engines, compared step by step.

``python -m cstorch.parity [options] script.py [script args...]`` runs the script once per
engine, each in its own process (JAX's thread pools would slow eager torch sharing a process):
eager torch (the reference's own CPU behaviour, ``engine="eager"``), JAX on CPU, and JAX on
GPU when JAX sees one. Every value passed to a step or checkpoint closure is recorded by step,
as is every model's and optimizer's final state. The tool prints the per-step values side by
side with their relative differences, the first step past tolerance and the largest final
state difference, and exits 1 past tolerance (2 if an engine failed), so it can gate CI.
"""

from cstorch.parity.compare import compare_closures, compare_state, first_divergence, table
from cstorch.parity.runner import ENGINES, available_engines, main, run_engine

__all__ = ["ENGINES", "available_engines", "compare_closures", "compare_state",
           "first_divergence", "main", "run_engine", "table"]
