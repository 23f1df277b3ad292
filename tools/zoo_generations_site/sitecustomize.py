"""Loaded first by every Model Zoo process ``tools/zoo_generations.py`` starts (this folder
leads ``PYTHONPATH``); the zoo's own code and command line are untouched.

* At exit it writes to ``$ZOO_GENERATIONS_PROBE`` which Cerebras modules the process loaded
  and from where, so the table can say whether this project's cstorch ran (a zoo that finds
  no Cerebras software falls back to plain torch in some releases); also which modules came
  from this project's ``tests/`` folder (stand-ins) and where ``torch_xla`` came from.
* numpy 2 removed ``np.cast``, which the zoo's dummy GPT data calls (``np.cast["int32"]``);
  it is given back (numpy 2 is what JAX requires).
* ``importlib.util`` is imported: the 1.7/1.8 zoo's ``modelzoo/__init__.py`` calls
  ``importlib.util.find_spec`` after only ``import importlib``, which works only where
  something imported ``importlib.util`` earlier at startup (tests/zoo/GENERATIONS_1x.md).
"""

import atexit
import importlib.util  # noqa: F401 (see the module doc)
import json
import os
import sys

_PROBE = os.environ.get("ZOO_GENERATIONS_PROBE")
_PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _where(name):
    module = sys.modules.get(name)
    if module is None:
        return None
    return getattr(module, "__file__", None) or list(getattr(module, "__path__", []))


def _report():
    cstorch = sys.modules.get("cstorch")
    engine = None
    if cstorch is not None:
        try:
            from cstorch.core.engine import resolve_engine

            engine = resolve_engine()
        except Exception as exc:  # noqa: BLE001 (the probe must never fail the run it watches)
            engine = f"unknown ({exc})"
    names = (
        "cerebras.pytorch",
        "cerebras_pytorch",
        "cstorch",
        "cerebras.appliance",
        "cerebras_appliance",
        "torch",
    )
    report = {name: _where(name) for name in names}
    where = report["cstorch"]
    report["project_cstorch"] = bool(where) and str(where).startswith(_PROJECT)
    report["engine"] = engine
    # what the process loaded from this project's tests/ folder (tests/zoo/stubs: the
    # stand-ins put on the path only where the zoo's Python lacks a package), and where the
    # torch_xla pieces the 1.6 zoo imports came from (cerebras_pytorch.lazy.xla_pieces)
    tests = os.path.join(_PROJECT, "tests") + os.sep
    report["from_tests"] = sorted(
        name
        for name, module in list(sys.modules.items())
        if str(getattr(module, "__file__", None) or "").startswith(tests)
    )
    xla = sys.modules.get("torch_xla")
    report["torch_xla"] = (
        None
        if xla is None
        else (getattr(xla, "__file__", None) or getattr(xla.__spec__, "origin", None))
    )
    with open(_PROBE, "w") as f:
        json.dump(report, f, indent=1)


if _PROBE:
    atexit.register(_report)

try:
    import numpy as _np

    if not hasattr(_np, "cast"):
        _np.cast = {
            name: (lambda x, name=name: _np.asarray(x, dtype=name))
            for name in ("int32", "int64", "float32", "float16")
        }
except ImportError:
    pass
