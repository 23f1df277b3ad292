"""Gradient accumulation (``TrainingLoop(grad_accum_steps=...)``)."""

from __future__ import annotations

import warnings

from cerebras.modelzoo.trainer.callbacks.callback import CoreCallback


class GradientAccumulationCallback(CoreCallback):
    """Decides whether a step runs the optimizer.

    On this engine a step is one compiled program and gradients do not outlive it, so only
    ``grad_accum_steps=1`` runs on CPU/GPU (a larger batch is the equivalent); on CSX the
    setting is left to the modeled system's micro-batching, as on a real wafer.
    """

    def __init__(self):
        self.grad_accum_steps = 1
        self.should_run_optimizer_step = True

    def setup(self, trainer):
        from cerebras.modelzoo.trainer.callbacks.loop import TrainingLoop

        loop = trainer.loop
        steps = loop.grad_accum_steps if isinstance(loop, TrainingLoop) else 1
        if steps > 1:
            if trainer.backend.is_csx:
                warnings.warn(
                    "grad_accum_steps is ignored on CSX: the system accumulates "
                    "gradients itself through micro-batching.",
                    stacklevel=2,
                )
                steps = 1
            else:
                raise NotImplementedError(
                    f"grad_accum_steps={steps} is not supported on the "
                    f"{trainer.backend.backend_type.name} backend of this engine: each "
                    "training step is one compiled program and gradients do not persist "
                    f"between steps. Use a batch {steps}x larger instead."
                )
        self.grad_accum_steps = steps
