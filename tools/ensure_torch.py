"""Keeps the environment's torch when it is in the supported range; installs one when there is
none. Run by ``make`` before ``pip install -e .`` (``python tools/ensure_torch.py 2.13.0``).

* torch installed and inside pyproject's range: kept, never replaced (pip then leaves it too,
  since it satisfies the requirement);
* no torch: ``pip install torch==DEFAULT`` (the Makefile's default is the CPU build that lies on
  this machine's disk; a range would let pip pick a CUDA build of several GB);
* torch outside the range: exit status 2 and a message; nothing is changed.

It reads the range from ``pyproject.toml`` and does not import torch.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def supported_range(pyproject: str = os.path.join(ROOT, "pyproject.toml")) -> str:
    """The specifier of torch in the project's dependencies, e.g. ``">=2.9,<2.15"``."""
    with open(pyproject, "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    for requirement in dependencies:
        match = re.fullmatch(r"\s*torch\s*([<>=!~][^;]*)", requirement)
        if match:
            return match.group(1).replace(" ", "")
    raise SystemExit("pyproject.toml names no torch range")


def release(version: str) -> tuple:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``: the release numbers, without local or pre-release
    parts."""
    match = re.match(r"\d+(\.\d+)*", version)
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in match.group(0).split("."))


def _pad(a: tuple, b: tuple) -> tuple:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def in_range(version: str, specifier: str) -> bool:
    """Whether ``version`` satisfies every clause of ``specifier`` (``>=``, ``>``, ``<=``,
    ``<``, ``==``, ``!=``, comma-separated), comparing release numbers."""
    for clause in filter(None, specifier.split(",")):
        match = re.fullmatch(r"(>=|<=|==|!=|>|<)([\d.]+)", clause)
        if match is None:
            raise ValueError(f"unsupported version clause {clause!r}")
        op, bound = match.groups()
        have, want = _pad(release(version), release(bound))
        ok = {">=": have >= want, "<=": have <= want, ">": have > want, "<": have < want,
              "==": have == want, "!=": have != want}[op]
        if not ok:
            return False
    return True


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
        return subprocess.call([sys.executable, "-m", "pip", "install", "-q",
                                f"torch=={default}"])
    if in_range(version, specifier):
        print(f"keeping torch {version} (supported: torch{specifier})")
        return 0
    print(f"torch {version} is installed here, outside the supported range torch{specifier}. "
          f"Install a torch in that range yourself, or use a fresh virtualenv (make installs "
          f"torch {default} there); nothing was changed.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
