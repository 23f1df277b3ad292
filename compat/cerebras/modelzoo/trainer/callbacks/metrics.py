"""Logs the ``cstorch.metrics`` a model holds at the end of each validation."""

from __future__ import annotations

from cerebras.pytorch.metrics import Metric

from cerebras.modelzoo.trainer.callbacks.callback import Callback


class ModelEvalMetrics(Callback):
    """After a validation loop: logs every metric module of the model, then resets it."""

    def on_validate_end(self, trainer, model, loop):
        if not trainer.backend.is_e2e_execution:
            return
        values = {}
        for metric in model.modules():
            if not isinstance(metric, Metric):
                continue
            if metric.num_updates == 0:
                trainer.logger.warning(
                    f"Metric {metric.name!r} was never updated; not logging "
                    "it. Update it every step or remove it from the model."
                )
                continue
            values[metric.name] = float(metric)
            metric.reset()
        for name, value in values.items():
            trainer.logger.info(f"  - {name} = {value}")
        if values:
            trainer.log_metrics(**values)
