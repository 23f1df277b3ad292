"""Writes ``tests/data/export_jax_0_7_0/``: a step exported by JAX 0.7.0, whose ``jax.export``
serialization (version 2) JAX 0.12 no longer reads without a flag (it is past JAX's six-month
compatibility window). ``tests/cstorch/test_export.py`` loads it.

Run once, from the project root, in a venv with JAX 0.7.0 (any torch of the supported range)::

    python -m venv .venv-jax07 && .venv-jax07/bin/pip install torch==2.13.0 && \\
        .venv-jax07/bin/pip install jax==0.7.0 jaxlib==0.7.0 -e .
    PYTHONPATH=.:compat .venv-jax07/bin/python tests/data/make_old_export.py

The step is SGD with momentum on a ``Linear(3, 2)`` (seed 0), batches from
``torch.Generator().manual_seed(i)``; the losses of its first three steps, from cstorch itself,
go to ``expected.json`` beside the artifact. The artifact's copy of the loader module
(``exported_step.py``) is left out: the test loads it with ``jax_backend.exported``.
"""

import json
import os
import shutil
import sys

import jax
import torch

import cerebras.pytorch as cstorch
from tests.training import linear_mse_batch, sgd_linear_mse_step

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, f"export_jax_{jax.__version__.replace('.', '_')}")


def main():
    _, training_step = sgd_linear_mse_step()
    path = cstorch.export(training_step, linear_mse_batch(0), OUT)
    os.remove(os.path.join(path, "exported_step.py"))
    losses = [float(training_step(*linear_mse_batch(i))) for i in range(3)]
    with open(os.path.join(path, "expected.json"), "w") as f:
        json.dump(
            {"losses": losses, "jax": jax.__version__, "torch": torch.__version__}, f, indent=1
        )
    shutil.rmtree(os.path.join(os.getcwd(), "cerebras_logs"), ignore_errors=True)
    print(path, losses)


if __name__ == "__main__":
    sys.exit(main())
