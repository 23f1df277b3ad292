"""``cerebras.modelzoo.trainer``: the Model Zoo Trainer API on this engine.

This is a namespace portion: ``cerebras/modelzoo/`` has no ``__init__.py``, so an installed
Cerebras Model Zoo (a regular ``cerebras.modelzoo`` package) takes precedence entirely.
"""

from cerebras.modelzoo.trainer import callbacks, loggers
from cerebras.modelzoo.trainer.trainer import Trainer


def summarize_scalar(name, value):
    """Logs a scalar from inside a step (a ``cstorch.summarize_scalar`` equivalent): routed to
    the trainer's loggers by the running Trainer."""
    from cerebras.modelzoo.trainer.trainer import running_trainer

    trainer = running_trainer()
    if trainer is None:
        raise RuntimeError(
            "summarize_scalar needs a running Trainer (call it from the model "
            "or a callback during fit/validate)."
        )
    trainer.log_metrics(**{name: value})


summarize_tensor = summarize_scalar

__all__ = ["Trainer", "callbacks", "loggers", "summarize_scalar", "summarize_tensor"]
