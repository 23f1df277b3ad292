"""``PyTorchCSCompiler``: ``--compile_only`` / ``--validate_only``.

Captures and compiles one step on the modeled wafer without running it, and writes the
compile artifacts into the compile directory (``runconfig.compile_dir``, default
``<model_dir>/cerebras_compile``): ``<mode>_step.jaxpr.txt`` (the captured program) and, for
``compile_only``, ``<mode>_step.stablehlo.mlir`` and ``<mode>_step.cost_analysis.json``
(XLA's estimate of flops and bytes). Nothing trains and no checkpoint is written.
"""

from __future__ import annotations

import json
import logging
import os

from modelzoo.common.pytorch import modes
from modelzoo.common.pytorch.pytorch_base_cs_runner import PyTorchBaseCSRunner


class PyTorchCSCompiler(PyTorchBaseCSRunner):
    """Compiles the train or eval step and writes its artifacts; trains nothing."""

    def __init__(self, model, params):
        super().__init__(model, params)
        runconfig = self._runconfig
        self._validate_only = bool(runconfig.get("validate_only"))
        self._compile_dir = runconfig.get("compile_dir") or os.path.join(
            self._model_dir, "cerebras_compile"
        )

    def _save_checkpoint(self, step):
        raise RuntimeError("A compile-only/validate-only run does not produce checkpoints.")

    def train(self, train_dataloader):
        self._compile(modes.TRAIN, train_dataloader)

    def evaluate(self, eval_dataloader):
        self._compile(modes.EVAL, eval_dataloader)

    def eval_all(self, eval_dataloader):
        self._compile(modes.EVAL, eval_dataloader)

    def _compile(self, mode, dataloader):
        self._global_step = self._initial_step = 0
        if mode == modes.TRAIN:
            self._set_training(True)
            group = [
                self.on_train_batch_start(data)
                for data, _ in zip(dataloader, range(self._grad_accum_steps))
            ]
            traced = self._get_train_step()
            traced.compile_only(group)  # captured and compiled, not run
        else:
            self._set_training(False)
            data = self.on_eval_batch_start(next(iter(dataloader)))
            traced = self._get_eval_step()
            traced.compile_only(data)
        self._write_artifacts(mode, traced)

    def _write_artifacts(self, mode, traced):
        os.makedirs(self._compile_dir, exist_ok=True)
        stem = os.path.join(self._compile_dir, f"{mode}_step")
        with open(f"{stem}.jaxpr.txt", "w") as f:
            f.write(str(traced.jaxpr()))
        written = [f"{stem}.jaxpr.txt"]
        if not self._validate_only:
            with open(f"{stem}.stablehlo.mlir", "w") as f:
                f.write(traced.stablehlo())
            cost = traced.cost_analysis()
            if isinstance(cost, (list, tuple)):
                cost = cost[0] if cost else {}
            with open(f"{stem}.cost_analysis.json", "w") as f:
                json.dump(
                    {k: float(v) for k, v in dict(cost or {}).items()}, f, indent=1, sort_keys=True
                )
            written += [f"{stem}.stablehlo.mlir", f"{stem}.cost_analysis.json"]
        self.compile_artifacts = written
        what = "Validation" if self._validate_only else "Compile"
        logging.info(f"{what} for {mode} successful; artifacts in {self._compile_dir}")
