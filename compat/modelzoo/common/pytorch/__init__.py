"""``modelzoo.common.pytorch``: the Model Zoo 1.6–1.9 runner system on the JAX engine.

``run_utils.run`` is the entry point of 1.x ``run.py`` scripts; ``PyTorchBaseModel`` and
the runner classes (``PyTorchRunner``, ``PyTorchCSAppliance``, ``PyTorchCSCompiler``,
``PyTorchCSRunner``, ``PyTorchDistRunner``) keep their 1.x hooks; ``cb_model``, ``metrics``,
``utils`` and ``half_dtype`` are the helpers 1.x model directories import.

``modelzoo`` and ``modelzoo.common`` are namespace packages here (no ``__init__.py``), so a
checkout of the real Model Zoo on the path (a regular ``modelzoo`` package) replaces all of
this, while a user's own ``modelzoo/<model>/pytorch/`` tree (without the zoo's
``modelzoo/__init__.py``) merges with it.
"""

import contextlib

import cerebras_pytorch as cbtorch  # noqa: F401  (1.x: cbtorch.load / cbtorch.save)
from modelzoo.common.pytorch import (
    cb_model as cb_model,
    modes as modes,
    runner_factory,  # noqa: F401  (PyTorchBaseRunner.create)
)


@contextlib.contextmanager
def name_scope(name: str):
    """1.x name scopes only labelled the graph; they have no effect here."""
    yield None
