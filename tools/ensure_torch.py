"""Keeps the environment's torch when it is in the supported range; installs one when there is
none. Run by ``make`` before ``pip install -e .`` (``python tools/ensure_torch.py 2.13.0``).

* torch installed and inside pyproject's range: kept, never replaced (pip then leaves it too,
  since it satisfies the requirement);
* no torch: ``pip install torch==DEFAULT`` (the Makefile's default is the CPU build that lies on
  this machine's disk; a range would let pip pick a CUDA build of several GB);
* torch outside the range: exit status 2 and a message; nothing is changed.

It reads the range from ``pyproject.toml`` (``declared_range``: ``packaging``'s specifiers)
and does not import torch.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

from declared_range import allows, declared_range


def supported_range() -> str:
    """The specifier of torch in the project's dependencies, e.g. ``">=2.9,<2.16"``."""
    clauses = sorted(
        declared_range("torch"), key=lambda c: (not c.operator.startswith(">"), c.version)
    )
    return ",".join(str(c) for c in clauses)


def in_range(version: str, specifier: str) -> bool:
    """Whether ``version`` satisfies ``specifier`` as pip decides it (PEP 440: a local part
    such as ``+cpu`` is ignored; ``2.16.0.dev1``, a pre-release of the excluded bound, is
    outside ``<2.16``)."""
    return allows(specifier, version)


def installed_torch():
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python tools/ensure_torch.py DEFAULT_VERSION")
    default, specifier = argv[0], supported_range()
    version = installed_torch()
    if version is None:
        print(f"no torch here: installing torch=={default}", flush=True)
        return subprocess.call([sys.executable, "-m", "pip", "install", "-q", f"torch=={default}"])
    if in_range(version, specifier):
        print(f"keeping torch {version} (supported: torch{specifier})")
        return 0
    print(
        f"torch {version} is installed here, outside the supported range torch{specifier}. "
        f"Install a torch in that range yourself, or use a fresh virtualenv (make installs "
        f"torch {default} there); nothing was changed.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
