"""Which engine runs a traced step: ``"jax"`` (capture once, run the jitted program) or
``"eager"`` (run the step body as plain eager torch every step).

The eager engine is the reference implementation's own CPU behaviour: the same closures,
checkpoints, data executor and optimizer/scheduler objects, but every op runs in torch as it
is called. It exists to compare engines (``python -m cstorch.parity``) and to debug a step with
ordinary Python tools. Choose it with ``cstorch.backend("CPU", engine="eager")`` or, without
touching the script, with the environment variable ``CSTORCH_ENGINE=eager``; an explicit
argument wins over the variable.

Differences from the JAX engine are those of eager torch: tensors in the step have values
(``.item()`` works), randomness follows torch's generators, and gradients persist between
steps unless the step zeroes them (as in the reference on CPU). ``cstorch.export`` and the
program introspection (``jaxpr()``, ...) need the JAX engine. Built-in optimizers and schedules run the same pure update rules in both
engines (``jax_backend.torch_ops``), so a parity run compares forward and backward passes.
A ``torch.optim`` optimizer stepped in the step joins the backend's optimizers at its first
step, as the JAX engine adopts it at the first capture, so both engines list (and a parity
run records) the same optimizers in the same order.
"""

from __future__ import annotations

import contextlib

from torch.optim.optimizer import register_optimizer_step_pre_hook

from cstorch import config
from jax_backend.errors import CstorchValueError

ENGINES = ("jax", "eager")
ENGINE_VARIABLE = config.engine.env_var


def resolve_engine(engine: str | None = "auto") -> str:
    """The engine to use: ``engine`` unless it is "auto" (or None), else ``$CSTORCH_ENGINE``,
    else ``"jax"``."""
    source = "engine"
    if engine is None or engine == "auto":
        engine, source = config.engine.value or "jax", f"${ENGINE_VARIABLE}"
    if not isinstance(engine, str) or engine.lower() not in ENGINES:
        raise CstorchValueError(
            f"Unknown engine {engine!r} (from {source}). Use one of {', '.join(ENGINES)}: "
            '"jax" compiles the step once, "eager" runs it as eager torch every step.'
        )
    return engine.lower()


def run_eagerly(step_fn, impl, args, kwargs):
    """One call of ``step_fn`` as eager torch, under the precision policy the JAX engine
    would capture it with (autocast for mixed precision)."""
    impl.materialize_state()  # no-op unless state was last written on the JAX side
    with impl.precision_policy().capture_context(), _registering_optimizers(impl):
        return step_fn(*args, **kwargs)


@contextlib.contextmanager
def _registering_optimizers(impl):
    """While the step body runs: an optimizer stepped in it that the backend does not know
    (a ``torch.optim`` one; cstorch's register when built) is registered before it steps."""

    def register(optimizer, args, kwargs):
        if not any(optimizer is known for known in impl.registry.optimizers):
            impl.register_optimizer(optimizer)

    handle = register_optimizer_step_pre_hook(register)
    try:
        yield
    finally:
        handle.remove()
