"""A traced step exported and its artifact run beside it, for the tests that check an export
keeps XLA's kernels and trains as the traced step does."""

import cerebras.pytorch as cstorch
from jax_backend import exported


def exported_beside(step, batches, directory):
    """Exports the traced ``step`` (its example inputs: the first of ``batches``) to
    ``directory``, loads the artifact, and runs the artifact, then ``step``, on every batch:
    (the artifact's MLIR module as text, its losses, the traced step's losses)."""
    artifact = cstorch.export(step, batches[0], str(directory))
    exported_step = exported.load(artifact)
    module = str(exported_step.exported.mlir_module())
    theirs = [float(exported_step(*(t.numpy() for t in batch))) for batch in batches]
    ours = [float(step(*batch)) for batch in batches]
    return module, theirs, ours
