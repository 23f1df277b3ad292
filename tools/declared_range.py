"""The version ranges pyproject.toml declares for the project's dependencies, read with
``packaging``'s requirement parser (pip's vendored copy where ``packaging`` is not installed:
``make`` runs ``ensure_torch.py`` in a fresh venv, before anything is installed there).

``declared_range("torch")`` -> ``SpecifierSet(">=2.9,<2.16")``; ``allows(spec, "2.15.0+cu132")``
follows PEP 440 as pip does (a local suffix such as ``+cpu`` is ignored, a pre-release of the
upper bound is outside the range).
"""

from __future__ import annotations

import os
import tomllib

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ImportError:  # a venv with pip alone
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYPROJECT = os.path.join(ROOT, "pyproject.toml")


def declared_range(package: str, pyproject: str = PYPROJECT) -> SpecifierSet:
    """The specifier of ``package`` among pyproject's ``[project] dependencies``."""
    with open(pyproject, "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    for line in dependencies:
        requirement = Requirement(line)
        if requirement.name.lower() == package.lower():
            return requirement.specifier
    raise SystemExit(f"pyproject.toml names no {package} range")


def allows(specifier: SpecifierSet | str, version: str) -> bool:
    """Whether ``version`` lies in ``specifier`` (pre-releases of a release in the range
    count, as an installed nightly should)."""
    return SpecifierSet(str(specifier)).contains(Version(version), prereleases=True)
